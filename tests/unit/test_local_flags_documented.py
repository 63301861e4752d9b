"""docs/local.md's Settings section lists every flag of ``python -m coworker_local``, and no flag
it does not have: the tables are compared with the argparse parser, so they cannot drift again."""

from __future__ import annotations

import re
from pathlib import Path

from coworker_local.__main__ import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "local.md"


def _documented_flags() -> set[str]:
    """Flags named in the first two cells of the table rows of the doc's Settings section."""
    text = DOC.read_text()
    section = text[text.index("\n## Settings"):]
    section = section[:section.index("\n## ", 1)]
    flags: set[str] = set()
    for row in section.splitlines():
        if row.startswith("|"):
            for cell in row.split("|")[1:3]:
                flags.update(re.findall(r"`(--[a-z][a-z-]*)", cell))
    return flags


def test_the_doc_lists_every_flag_of_the_local_runtime() -> None:
    parser = build_parser()
    flags = {option for action in parser._actions for option in action.option_strings
             if option.startswith("--") and option != "--help"}
    documented = _documented_flags()
    assert not flags - documented, f"flags missing from docs/local.md's tables: {sorted(flags - documented)}"
    assert not documented - flags, f"docs/local.md lists flags the runtime lacks: {sorted(documented - flags)}"
