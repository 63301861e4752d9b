"""Each function starts from its own synthesized asset, with the environment the template gives it;
the container runner runs from its image's build context, with its task role.

Lambda imports ``handler`` from the function's code asset with the layer's ``python/`` folder on
the path and the template's environment variables set, and runs the module's start-up
(``bootstrap.configure``: settings, handler modules, clients) before the first event. Here each
function's module is imported the same way, in a process of its own: a setting it cannot read
or a handler module its code does not hold stops it there, as it would stop it on AWS.

ECS runs ``python main.py`` in the image built from the runner's build context, with the
container's environment from the task definition and the start request in RunTask's container
overrides. Here the coordinator, from its asset, starts the runner through the rehearsal's gateway
(``ecs:RunTask`` and ``iam:PassRole`` held to its role), and the runner runs from the build
context as it is, its requests held to its task role.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from coworker.engine import slots

from tests.rehearsal.rehearse import BIG_BYTES, FAST, deployed
from tests.rehearsal.template import RUNNER, Targets, asset_dir, environment_of, functions_of, layer_dir
from tests.support.handler_packages import write_handler_package

pytest.importorskip("aws_cdk")

CASES = {
    "defaults": {},
    # (with a type of the container runner, and timings short enough for the runner's rehearsal)
    "bucket-limits-and-runner": {"resultsBucket": "true", "maxConcurrency": "30", "batchSize": "5", **FAST},
    "handler-modules": {"handlerModules": "{package}.reports.summary", "exampleHandlers": "false"},
}
RUNNER_CASE = "bucket-limits-and-runner"
LONG_TYPE = "rehearsal-long"
LONG_TASKS = f'''
    import os
    import time

    from coworker import task_handler

    @task_handler({LONG_TYPE!r}, runner="container")
    def long(payload, context):
        """Container work: long enough for heartbeats, a result too large for the record, and
        the runner slot it was started for (from RunTask's container overrides)."""
        time.sleep(payload["seconds"])
        return {{"text": "x" * payload["bytes"], "slot": os.environ["COWORKER_RUNNER_SLOT"]}}
'''


@dataclass
class Synthesized:
    template: dict[str, Any]
    assembly_dir: Path


@pytest.fixture(scope="module")
def synthesized(synthesize, tmp_path_factory) -> Callable[[str], Synthesized]:
    """The stack of one of :data:`CASES`, synthesized once for this module's tests, with a team's
    handlers package (and, in the runner's case, a module of container work)."""
    done: dict[str, Synthesized] = {}

    def get(case: str) -> Synthesized:
        if case not in done:
            package, name, _ = write_handler_package(tmp_path_factory.mktemp(case))
            if case == RUNNER_CASE:
                (package / "long_tasks.py").write_text(textwrap.dedent(LONG_TASKS))
            options = {"handlersDir": str(package), **{k: v.format(package=name) for k, v in CASES[case].items()}}
            stack, assembly = synthesize(options)
            done[case] = Synthesized(assembly.get_stack_by_name(stack.stack_name).template, Path(assembly.directory))
        return done[case]

    return get


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


@pytest.mark.parametrize("case", list(CASES))
def test_each_function_starts_from_its_asset_with_its_environment(synthesized, case) -> None:
    # Given the stack synthesized with a team's handlers package and the options of this case
    stack = synthesized(case)
    layer = layer_dir(stack.template, stack.assembly_dir)
    functions = functions_of(stack.template)
    assert sorted(functions) == ["api", "coordinator", "worker"]

    # When each function's module is imported from its own asset, with its own environment
    failed = {role: start(function, stack.assembly_dir, layer) for role, function in functions.items()}

    # Then each one starts
    errors = {role: run.stderr.strip().splitlines()[-1] for role, run in failed.items() if run.returncode != 0}
    assert not errors, f"functions that would not start on Lambda: {errors}"


@pytest.mark.slow
def test_the_runner_runs_its_task_from_its_build_context_with_its_task_role(synthesized, make_settings,
                                                                           tmp_path) -> None:
    # Given the stack with a type of the container runner, stood up on the local services
    stack = synthesized(RUNNER_CASE)
    with deployed(stack.template, stack.assembly_dir, make_settings, tmp_path) as deployment:
        runners = deployment.runners
        assert runners is not None

        # When a task of that type is put, and a coordinator run starts a runner for it (RunTask)
        code, body = deployment.call("POST", "/tasks", {"key": "long", "type": LONG_TYPE,
                                                        "payload": {"seconds": 2.5, "bytes": BIG_BYTES}})
        assert code == 201, body
        deployment.wait(lambda: runners.started > 0, "a runner started by the coordinator")
        # (no coordinator run after it: a later run does not know the key was handed to a runner
        # still starting, and would start another for it)
        deployment.wait(runners.ended, "the runner exited", supervise=False)

        # Then the runner claimed the task, ran it and recorded its result (in the results bucket), and exited 0
        assert runners.exit_codes() == [0], (tmp_path / "runner.log").read_text()[-4000:]
        assert not deployment.problems(), "\n".join(deployment.problems())
        assert deployment.status("long") == "finished"
        code, result = deployment.call("GET", "/tasks/long/result")
        assert code == 200 and len(result["text"]) == BIG_BYTES, (code, str(result)[:300])
        assert result["slot"].startswith(slots.RUNNERS.prefix)  # the slot RunTask's overrides named
        # and every request was held to its role: the runner's to its task role, the start to the coordinator's
        bucket = Targets.of(stack.template).bucket
        runner_allowed = deployment.gateway.allowed(RUNNER)
        assert {("s3:PutObject", "results")} <= {(action, resource.removeprefix(f"{bucket}/").split("/")[0])
                                                  for action, resource in runner_allowed}
        assert {"dynamodb:UpdateItem", "dynamodb:Query"} <= {action for action, _ in runner_allowed}
        started = {action for action, _ in deployment.gateway.allowed("coordinator")}
        assert {"ecs:RunTask", "iam:PassRole"} <= started
        # (a Lambda worker the API started on submit left it: container work is never a worker's)
        assert not [invocation.answer for invocation in deployment.pools["worker"].invocations
                    if (invocation.answer or {}).get("result", {}).get("outcomes", {}).get("finished")]
        done = [json.loads(line) for line in (tmp_path / "runner.log").read_text().splitlines()
                if line.startswith("{") and '"runner done"' in line]
        assert [line["outcomes"] for line in done] == [{"finished": 1}], done
