"""The real CDK CLI synthesizes app.py offline, and cfn-lint accepts the template.

Needs node_modules (``npm ci``); CI runs it, a machine without it skips with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra import constants as c
from tests.infra.support import missing_function_code

CDK_BIN = c.REPO_ROOT / "node_modules" / ".bin" / "cdk"
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
        [str(CDK_BIN), "synth", "--quiet", "--output", str(out), "-c", "layerDependencies=skip"],
        cwd=c.REPO_ROOT,
        env=offline_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    template = out / f"{c.STACK_ID}.template.json"
    assert template.is_file()

    cfn_lint = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or shutil.which("cfn-lint")
    assert cfn_lint, "cfn-lint is in requirements-dev.txt"
    lint = subprocess.run(
        [cfn_lint, "--ignore-checks", *CFN_LINT_IGNORED, "--", str(template)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
