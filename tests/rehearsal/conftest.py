"""The deploy rehearsal tier: the synthesized stack's grants and environments held against what
each function's code does. It synthesizes the stack with the infrastructure tier's fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.infra.conftest import functions_dir, synthesize  # noqa: F401  (shared fixtures)
from tests.rehearsal.rehearse import FAST, Deployment, deployed, write_rehearsal_handlers


@pytest.fixture
def deploy(synthesize, make_settings, tmp_path) -> Iterator[Callable[[dict[str, str]], Deployment]]:  # noqa: F811
    """Synthesize the stack with a team's handlers package and ``options``, and stand it up on
    the local services."""
    with ExitStack() as stack:

        def run(options: dict[str, str]) -> Deployment:
            package, name = write_rehearsal_handlers(tmp_path)
            context = {**FAST, "handlersDir": str(package),
                       **{key: value.format(package=name) for key, value in options.items()}}
            cdk_stack, assembly = synthesize(context)
            template = assembly.get_stack_by_name(cdk_stack.stack_name).template
            return stack.enter_context(deployed(template, Path(assembly.directory), make_settings, tmp_path))

        yield run
