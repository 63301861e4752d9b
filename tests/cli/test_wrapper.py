"""scripts/coworker: the command a new user runs from a checkout, without activating .venv."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wrapper_runs_the_installed_command_from_anywhere(tmp_path):
    # Given a shell whose PATH has no .venv, in another directory, and a link to the wrapper
    link = tmp_path / "coworker"
    link.symlink_to(ROOT / "scripts" / "coworker")
    environ = {**os.environ, "PATH": "/usr/bin:/bin"}
    environ.pop("VIRTUAL_ENV", None)
    for command in (ROOT / "scripts" / "coworker", link):
        # When it is run
        result = subprocess.run([str(command), "submit", "--help"], capture_output=True, text=True, cwd=tmp_path,
                                env=environ, timeout=60)
        # Then it is the coworker command
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: coworker submit")
