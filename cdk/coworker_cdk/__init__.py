"""AWS CDK (v2) construct of Coworker: ``from coworker_cdk import TaskSystem`` (docs/deploy.md).

``TaskSystem`` is loaded when first asked for, so that importing a function's handler module
(``coworker_cdk.functions``, as the local runtime does) does not load the CDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coworker_cdk.task_system import TaskSystem

__all__ = ["TaskSystem"]


def __getattr__(name: str) -> Any:
    if name == "TaskSystem":
        from coworker_cdk.task_system import TaskSystem

        return TaskSystem
    raise AttributeError(f"module 'coworker_cdk' has no attribute {name!r}")
