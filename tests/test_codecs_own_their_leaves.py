"""Codecs own their leaves: no module outside packrl/emulation/codecs.py branches on strings (Text,
a string codec, its view). Check, column check, native value, action decode and Numba field names
are the codecs' own methods, so a user's leaf type goes every way a shipped one does."""
from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "packrl"
STRING_BRANCH = re.compile(r"\bis_string\b|\bTextView\b|\bspaces\.Text\b|\bTextCodec\b|\bBoundedString\b|kind == .text.")
OWNERS = {"emulation/codecs.py", "emulation/__init__.py"}  # the codecs, and the package's re-exports of them
PENDING: set[str] = set()  # modules still to move into the codecs: this set only shrinks (empty since issue 28)


def string_branches() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        hits = [f"{name}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
                if STRING_BRANCH.search(line)]
        if hits and name not in OWNERS:
            found[name] = hits
    return found


def test_no_module_outside_the_codecs_branches_on_strings():
    found = string_branches()
    outside = {name: hits for name, hits in found.items() if name not in PENDING}
    assert not outside, "string branches outside the codecs:\n" + "\n".join(h for hits in outside.values() for h in hits)


def test_the_pending_list_only_names_modules_that_still_branch():
    assert PENDING <= set(string_branches()), f"remove {sorted(PENDING - set(string_branches()))} from PENDING"


def test_the_pattern_finds_a_branch():
    assert STRING_BRANCH.search("if leaf.codec.is_string:") and STRING_BRANCH.search("isinstance(s, spaces.Text)")
    assert not STRING_BRANCH.search("if leaf.codec.categorical:")
