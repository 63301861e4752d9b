"""A team's own CDK app, in a folder of its own: the construct installed as a package (the built
wheel, not this checkout), three lines of Python, the team's handlers package with a compiled
dependency. It synthesizes, its assets hold what Lambda's arm64 Python needs, and its stack runs
a batch through each function with its own role (the whole lifecycle: test_on_the_wire).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.rehearsal.rehearse import FAST, deployed, run_smoke, write_rehearsal_handlers
from tests.rehearsal.template import asset_dir, functions_of, layer_dir

pytest.importorskip("aws_cdk")

ROOT = Path(__file__).resolve().parents[2]
# What the wheel is built from (pyproject.toml's packages and dependencies).
PROJECT_FILES = ("pyproject.toml", "requirements.txt", "README.md", "layers", "cdk", "local")
# A dependency with a compiled extension and a pure-Python fallback: its Lambda wheel is proven
# by the file it holds, and the rehearsal (on this machine's CPU) still imports it.
COMPILED_REQUIREMENT = "markupsafe==3.0.2"
COMPILED_FILE = "markupsafe/_speedups.cpython-313-aarch64-linux-gnu.so"


def _snake(name: str) -> str:
    return "".join(f"_{ch.lower()}" if ch.isupper() else ch for ch in name)


def install_construct(tmp_path: Path) -> Path:
    """Build this repository's wheel and install it (without its dependencies, which the test
    environment has) into a folder of its own, as ``pip install`` would into the team's."""
    wheels, site, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    source.mkdir()
    # built from a copy, so that the build's leftovers (build/, *.egg-info) stay out of the checkout
    for name in PROJECT_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(wheels), str(source)], check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("coworker-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, cwd=tmp_path)
    return site


def write_app(app_dir: Path, package: str) -> None:
    options = ", ".join(f"{_snake(key)}={value!r}" for key, value in FAST.items())
    (app_dir / "app.py").write_text(textwrap.dedent(f'''
        import json, sys
        import aws_cdk as cdk
        from coworker_cdk import TaskSystem

        app = cdk.App()
        stack = cdk.Stack(app, "TeamTasks")
        tasks = TaskSystem(stack, "Tasks", handlers={package!r}, {options})
        cdk.CfnOutput(stack, "ApiUrl", value=tasks.api_url)
        app.synth()

        import coworker, coworker_cdk
        print(json.dumps({{"coworker": coworker.__file__, "coworker_cdk": coworker_cdk.__file__}}), file=sys.stderr)
    '''))


@pytest.mark.slow
def test_a_fresh_app_installs_the_construct_synthesizes_its_handlers_and_rehearses(tmp_path, make_settings) -> None:
    # Given the construct installed as a package, and an app folder with its own handlers package
    # that needs a compiled dependency
    site = install_construct(tmp_path)
    app_dir = tmp_path / "team-app"
    app_dir.mkdir()
    _, package = write_rehearsal_handlers(app_dir, requirements=COMPILED_REQUIREMENT, init="import markupsafe\n")
    write_app(app_dir, package)

    # When the app synthesizes as `cdk synth` runs it (in its folder, the output directory given)
    out = app_dir / "cdk.out"
    env = {**os.environ, "PYTHONPATH": str(site), "CDK_OUTDIR": str(out),
           "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20,22"}
    done = subprocess.run([sys.executable, "app.py"], cwd=app_dir, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]

    # Then the construct and the library came from the installed package, not this checkout
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert all(Path(path).is_relative_to(site) for path in loaded.values()), loaded
    template = json.loads((out / "TeamTasks.template.json").read_text())
    functions = functions_of(template)
    assert set(functions) == {"api", "coordinator", "worker"}
    # and the worker's asset holds the handlers package and its dependency built for Lambda
    worker_code = asset_dir(out, functions["worker"]["Properties"]["Code"])
    assert (worker_code / package / "tasks.py").is_file()
    assert (worker_code / COMPILED_FILE).is_file(), sorted(p.name for p in worker_code.iterdir())
    # and the layer holds the library and its locked dependencies for arm64
    layer = layer_dir(template, out)
    assert (layer / "python" / "coworker" / "__init__.py").is_file()
    assert list((layer / "python" / "pydantic_core").glob("*aarch64-linux-gnu.so"))

    # When the stack is stood up on the local services, each function from its asset with its role
    # (the layer's library only: its arm64 wheels cannot load on this machine, whose own stand in)
    library_only = tmp_path / "layer"
    shutil.copytree(layer / "python" / "coworker", library_only / "python" / "coworker")
    with deployed(template, out, make_settings, tmp_path, layer=library_only) as deployment:
        run_smoke(deployment)  # (the lifecycle's every step runs in test_on_the_wire, from this checkout)

        # Then nothing was denied, every function started and none failed
        assert not deployment.problems(), "\n".join(deployment.problems())
        for pool in deployment.pools.values():
            assert pool.invocations, pool.role
        # and the functions with the handlers package found its dependency in their own code
        for role in ("worker", "api"):
            assert {package, "markupsafe"} <= deployment.pools[role].modules_from_code(), role
