"""Synthesize the stack of a released commit into tests/infra/released/template-<commit>.json.

The upgrade rehearsal (tests/infra/test_upgrade.py) diffs HEAD's template against this snapshot by
logical ID. Refresh it at each release (``make released-template COMMIT=<released commit>``): the
commit's files are exported into a temporary folder (``git archive``) and its own ``app.py`` is
run the way the CDK CLI runs it (context from its ``cdk.json``, the default option set), with
this checkout's virtual environment, offline, without bundling assets (their hashes do not
matter to the diff) and without installing the layer's dependencies. The snapshot it replaces is removed.

The snapshot's commit is also the code tests/integration/test_upgrade_in_flight.py runs beside
HEAD's (:func:`released_commit`, :func:`export_tree`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASED_DIR = ROOT / "tests" / "infra" / "released"
STACK_ID = "Coworker"
# Offline: fake credentials, no version check, no warning about this machine's Node on every call.
OFFLINE = {
    "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
    "CDK_DISABLE_VERSION_CHECK": "1", "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "18,20,22",
    "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
}
# What the snapshot's synth skips: pip for the layer, Docker or copying for assets.
SYNTH_CONTEXT = {"layerDependencies": "skip", "aws:cdk:bundling-stacks": []}


class MissingCommitError(LookupError):
    """The released commit is not in this clone (a shallow one)."""


def released_commit() -> str:
    """The commit of the snapshot in ``tests/infra/released/``: the previous release."""
    (snapshot,) = RELEASED_DIR.glob("template-*.json")  # one release: the previous one
    return snapshot.stem.removeprefix("template-")


def export_tree(commit: str, dest: Path, paths: tuple[str, ...] = ()) -> Path:
    """Write ``commit``'s files (those under ``paths``, or all) into ``dest``, with ``git archive``:
    no worktree is registered and nothing in the clone changes, so parallel runs do not meet.
    :class:`MissingCommitError` if the clone does not hold the commit."""
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if found.returncode != 0:
        raise MissingCommitError(
            f"commit {commit} (the previous release) is not in the clone at {ROOT}: the upgrade rehearsal "
            "needs it; fetch the full history (git fetch --unshallow, or a clone without --depth)")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, *paths], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def synthesize(commit: str) -> dict:
    """The template the default deployment of ``commit`` gives."""
    with tempfile.TemporaryDirectory(prefix="coworker-released-") as tmp:
        tree = export_tree(commit, Path(tmp) / "tree")
        cdk_json = json.loads((tree / "cdk.json").read_text())
        context = {**cdk_json.get("context", {}), **SYNTH_CONTEXT}
        out = Path(tmp) / "cdk.out"
        env = {**os.environ, **OFFLINE, "CDK_OUTDIR": str(out), "CDK_CONTEXT_JSON": json.dumps(context)}
        subprocess.run([sys.executable, "app.py"], cwd=tree, env=env, check=True)
        return json.loads((out / f"{STACK_ID}.template.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the released commit (any name git knows)")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", parser.parse_args().commit],
                            check=True, capture_output=True, text=True).stdout.strip()
    template = synthesize(commit)
    for old in RELEASED_DIR.glob("template-*.json"):
        old.unlink()
    target = RELEASED_DIR / f"template-{commit}.json"
    target.write_text(json.dumps(template, indent=1, sort_keys=True) + "\n")
    print(f"{target.relative_to(ROOT)}: {len(template['Resources'])} resources")


if __name__ == "__main__":
    main()
