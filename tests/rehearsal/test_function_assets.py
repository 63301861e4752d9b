"""Each function starts from its own synthesized asset, with the environment the template gives it.

Lambda imports ``handler`` from the function's code asset with the layer's ``python/`` folder on
the path and the template's environment variables set, and runs the module's start-up
(``bootstrap.configure``: settings, handler modules, clients) before the first event. Here each
function's module is imported the same way, in a process of its own: a setting it cannot read
or a handler module its code does not hold stops it there, as it would stop it on AWS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.rehearsal.template import asset_dir, environment_of, functions_of, layer_dir
from tests.support.handler_packages import write_handler_package

pytest.importorskip("aws_cdk")

def start(function: dict[str, Any], assembly_dir: Path, layer_dir: Path) -> subprocess.CompletedProcess[str]:
    """Import the function's handler module as Lambda does (its start-up runs at import)."""
    code = asset_dir(assembly_dir, function["Properties"]["Code"])
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal",
        # Lambda puts the function's code first, then the layer's python/ folder.
        "PYTHONPATH": os.pathsep.join([str(code), str(layer_dir / "python")]),
        "POWERTOOLS_TRACE_DISABLED": "true",
        **environment_of(function),
    }
    handler_module, _, _ = function["Properties"]["Handler"].rpartition(".")
    return subprocess.run([sys.executable, "-c", f"import {handler_module}"], cwd=code, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("context", [
    {},
    {"resultsBucket": "true", "maxConcurrency": "30", "batchSize": "5"},
    {"handlerModules": "{package}.reports.summary", "exampleHandlers": "false"},
], ids=["defaults", "bucket-and-limits", "handler-modules"])
def test_each_function_starts_from_its_asset_with_its_environment(synthesize, tmp_path, context) -> None:
    # Given the stack synthesized with a team's handlers package and the options of this case
    package, name, _ = write_handler_package(tmp_path)
    options = {"handlersDir": str(package), **{k: v.format(package=name) for k, v in context.items()}}
    stack, assembly = synthesize(options)
    template = assembly.get_stack_by_name(stack.stack_name).template
    layer = layer_dir(template, Path(assembly.directory))
    functions = functions_of(template)
    assert sorted(functions) == ["api", "coordinator", "worker"]

    # When each function's module is imported from its own asset, with its own environment
    failed = {role: start(function, Path(assembly.directory), layer) for role, function in functions.items()}

    # Then each one starts
    errors = {role: run.stderr.strip().splitlines()[-1] for role, run in failed.items() if run.returncode != 0}
    assert not errors, f"functions that would not start on Lambda: {errors}"
