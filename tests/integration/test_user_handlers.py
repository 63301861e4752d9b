"""Your handlers on Coworker: the README's example runs as written, a package of your own runs end
to end through the test kit, and the repository's handlers/ package is what README shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from coworker_local.testing import LocalTaskSystem

from tests.support.handler_packages import write_handler_package

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
# A fenced Python block whose first line names the file it is: "# handlers/orders.py".
NAMED_BLOCK = re.compile(r"```python\n# (?P<path>[\w/]+\.py)\n(?P<body>.*?)```", re.DOTALL)


def readme_files() -> dict[str, str]:
    section = README.read_text().split("## Writing task handlers", 1)[1].split("\n## ", 1)[0]
    return {m["path"]: m["body"] for m in NAMED_BLOCK.finditer(section)}


def test_the_readme_shows_the_handler_shipped_in_handlers() -> None:
    files = readme_files()
    assert set(files) == {"handlers/orders.py", "tests/test_orders.py"}
    shipped = (REPO_ROOT / "handlers" / "orders.py").read_text()
    assert files["handlers/orders.py"].strip() in shipped


@pytest.mark.slow
def test_the_readme_handler_example_and_its_tests_run_as_written(tmp_path, db_backend) -> None:
    """The README's two files, written to a new project folder and run with pytest there."""
    for path, body in readme_files().items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    (tmp_path / "handlers" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COWORKER_")}
    env.update(COWORKER_LOCAL_DB=db_backend, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(REPO_ROOT / "layers" / "coworker" / "python"), str(REPO_ROOT / "local")]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout


def test_a_package_of_your_own_runs_end_to_end_with_retries_and_history(tmp_path, monkeypatch,
                                                                         dynamodb_server) -> None:
    package, name, task_type = write_handler_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with LocalTaskSystem(handler_modules=[name], dynamodb_endpoint=dynamodb_server.endpoint) as system:
        done = system.run(task_type, {"n": 4})
        assert (done["status"], done["attempts"], done["result"]) == ("finished", 1, {"doubled": 8, "attempt": 1})
        # A payload the handler cannot use: a system error each attempt, up to the ceiling.
        broken = system.run(task_type, {"m": 1}, max_attempts=2)
        assert (broken["status"], broken["attempts"]) == ("ignored", 2)
        assert [(e["attempt"], e["kind"]) for e in broken["errors"]] == [(1, "system"), (2, "system")]
        assert "KeyError" in broken["errors"][0]["message"]
        # The examples stay registered next to the package.
        assert system.run("flaky", {"fail_attempts": 1})["attempts"] == 2
        # Many tasks at once: the workers feed themselves until nothing is due.
        keys = [system.put(task_type, {"n": n}) for n in range(25)]
        system.drain()
        assert [system.get(key)["result"]["doubled"] for key in keys] == [2 * n for n in range(25)]
        assert system.open_tasks() == 0


def test_a_2_mb_result_goes_to_the_result_store_and_comes_back_whole(tmp_path, monkeypatch, dynamodb_server) -> None:
    package, name, task_type = write_handler_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with LocalTaskSystem(handler_modules=[name], dynamodb_endpoint=dynamodb_server.endpoint) as system:
        record = system.run(f"{task_type}-big", {"bytes": 2_000_000})
        assert record["status"] == "finished" and record["result"] is None
        ref = record["result_ref"]
        assert ref["bytes"] > 2_000_000 and len(ref["sha256"]) == 64 and ref["uri"].startswith("file://")
        assert system.result(record["key"]) == {"text": "é" * 1_000_000, "attempt": 1}
        small = system.run(task_type, {"n": 1})
        assert small["result"] == {"doubled": 2, "attempt": 1} and small["result_ref"] is None
