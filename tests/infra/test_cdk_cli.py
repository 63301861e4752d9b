"""The real CDK CLI synthesizes app.py offline, and cfn-lint accepts the template.

Needs node_modules (``npm ci``); CI runs it, a machine without it skips with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from coworker_cdk import constants as c

from tests.infra.support import missing_function_code

ROOT = Path(__file__).resolve().parents[2]
CDK_BIN = ROOT / "node_modules" / ".bin" / "cdk"
# CDK gives every function's role a DependsOn that its GetAtt already implies; harmless.
CFN_LINT_IGNORED = ("W3005",)


def offline_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="x",
        AWS_DEFAULT_REGION="us-east-1",
        CDK_DISABLE_VERSION_CHECK="1",
        JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="18,20,22",
        # cdk.json runs `python3 app.py`: make that the interpreter running the tests.
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    env.pop("AWS_PROFILE", None)
    return env


@pytest.mark.slow
def test_cdk_synth_offline_and_cfn_lint(tmp_path: Path) -> None:
    if not CDK_BIN.exists():
        pytest.skip("node_modules/.bin/cdk is absent: run `npm ci` first (the CI script does)")
    missing = missing_function_code()
    if missing:
        pytest.skip(f"functions/{','.join(missing)}/handler.py not written yet; app.py cannot package it")
    out = tmp_path / "cdk.out"
    result = subprocess.run(
        [
            str(CDK_BIN), "synth", "--quiet", "--output", str(out),
            "-c", "layerDependencies=skip",
            # A boolean setting as the command line passes it: the string "false".
            "-c", "dispatchOnSubmit=false",
        ],
        cwd=ROOT,
        env=offline_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    template = out / f"{c.STACK_ID}.template.json"
    assert template.is_file()
    functions = {
        props["Description"].split()[1].rstrip(":").lower(): props
        for resource in json.loads(template.read_text())["Resources"].values()
        if resource["Type"] == "AWS::Lambda::Function"
        for props in [resource["Properties"]]
    }
    assert set(functions) == {"coordinator", "worker", "api"}
    for role, props in functions.items():
        assert props["Environment"]["Variables"]["COWORKER_DISPATCH_ON_SUBMIT"] == "False", role
    assert functions["worker"]["ReservedConcurrentExecutions"] == 12  # the defaults: ceil(120 / 10)
    assert functions["coordinator"]["Timeout"] == 90

    cfn_lint = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or shutil.which("cfn-lint")
    assert cfn_lint, "cfn-lint is in requirements-dev.txt"
    lint = subprocess.run(
        [cfn_lint, "--ignore-checks", *CFN_LINT_IGNORED, "--", str(template)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
