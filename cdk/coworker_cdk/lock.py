"""Writes the layer's lock from the library's requirements: ``python -m coworker_cdk.lock``.

Run it from the repository's root after changing requirements.txt (or to take new releases),
and commit ``cdk/coworker_cdk/layer.lock``: every synth then builds the layer from exactly these
wheels, whoever runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from coworker_cdk import constants as c
from coworker_cdk.bundling import resolve

HEADER = ("# The Lambda layer's dependencies for Lambda's platform (arm64, Python {python}), with their\n"
          "# wheels' hashes. Made by `python -m coworker_cdk.lock` from requirements.txt; do not edit.\n")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    requirements = Path(args[0] if args else "requirements.txt")
    c.LAYER_LOCK.write_text(HEADER.format(python=c.PYTHON_VERSION) + resolve(requirements.read_text()))
    print(f"wrote {c.LAYER_LOCK}")


if __name__ == "__main__":
    main()
