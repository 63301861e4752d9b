"""Fixtures of the infrastructure tests: one synthesized stack per module.

The library is on the path through pyproject's ``pythonpath``. The layer is bundled without
its dependencies (context ``layerDependencies=skip``) so the tests never run pip.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
# The node this machine has may be past its end of life for jsii: a warning on every synth.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20,22")

from aws_cdk import (  # noqa: E402
    App,
    Stack,
    Validations,
    cx_api,  # noqa: E402
)
from coworker_cdk import constants as c  # noqa: E402
from coworker_cdk.stack import CoworkerStack  # noqa: E402

from tests.infra.support import FUNCTION_DIRS, missing_function_code  # noqa: E402


@pytest.fixture(scope="session")
def functions_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real functions/ directory, or stand-ins while some handler is not written yet.

    test_function_code_is_present reports the missing ones; the template does not depend on
    the handlers' contents.
    """
    if not missing_function_code():
        return c.FUNCTIONS_DIR
    stub = tmp_path_factory.mktemp("functions")
    for name in FUNCTION_DIRS:
        (stub / name).mkdir()
        (stub / name / "handler.py").write_text("def handler(event, context):\n    return None\n")
    return stub


@pytest.fixture(scope="session")
def synthesize(
    functions_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., tuple[Stack, cx_api.CloudAssembly]]:
    """Synthesize a Coworker app with the given context (and, optionally, cdk-nag)."""

    def run(context: dict[str, object], *, plugins: Callable[[App], list] | None = None):
        app = App(
            context={"layerDependencies": "skip", **context}, outdir=str(tmp_path_factory.mktemp("cdk.out"))
        )
        stack = CoworkerStack(app, functions_dir=functions_dir)
        if plugins is not None:
            Validations.of(app).add_plugins(*plugins(app))
        return stack, app.synth()

    return run
