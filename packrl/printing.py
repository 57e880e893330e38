"""Printing user-controlled text: every path, name or metadata field that packrl prints goes through ``shown``,
so a string read from a file or given on the command line cannot move the cursor, recolour or retitle a
terminal, and a lone surrogate (from a JSON ``"\\ud800"`` or an undecodable file name) cannot make ``print``
raise UnicodeEncodeError."""
from __future__ import annotations

import json
import math
import re
import shlex
import sys
from typing import Any

_UNSHOWN = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""C0, DEL, C1, line and paragraph separators, bidi controls, and surrogates (a Python str holds a surrogate
only unpaired: a pair is one astral character)."""


def shown(text: object) -> str:
    """``text`` (``str(text)`` for a non-string) with every control character and lone surrogate written as a
    Python escape (``\\x1b``, ``\\n``, ``\\u202e``, ``\\ud800``); everything else, non-ASCII letters included, as is."""
    return _UNSHOWN.sub(_escape_one, text if isinstance(text, str) else str(text))


def shell_word(text: object) -> str:
    """``text`` as one shell word a person can paste back: ``shlex.quote``'s, or where it holds control characters
    or lone surrogates, bash's ``$'...'`` with them escaped as ``shown`` writes them (so the pasted word names
    the same path, where a shown path inside plain quotes would name another)."""
    text = text if isinstance(text, str) else str(text)
    if not _UNSHOWN.search(text):
        return shlex.quote(text)
    return "$'" + _UNSHOWN.sub(_bash_escape, text.replace("\\", "\\\\").replace("'", "\\'")) + "'"


def _bash_escape(match: re.Match) -> str:
    """One character as bash's $'...' reads it back: ASCII as a byte; U+0080 and above by code point (bash writes
    it in the locale's encoding); a surrogate-escaped byte of an undecodable path (U+DC80-U+DCFF) as that byte."""
    code = ord(match.group())
    if code < 0x80 or 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code & 0xFF:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _escape_one(match: re.Match) -> str:
    return match.group().encode("unicode_escape").decode("ascii")  # "\\x1b", "\\n", "\\u202e", "\\ud800"


NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
"""How ``strict_json`` writes a non-finite float: as these strings (RFC 8259 JSON has no NaN or Infinity)."""


def strict_json(value: Any, **dumps: Any) -> str:
    """``value`` as strict RFC 8259 JSON, ASCII only (control characters and lone surrogates as ``\\u``
    escapes): a non-finite float is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    return json.dumps(_finite(value), ensure_ascii=True, allow_nan=False, **dumps)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE[repr(value)]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def plural(count: int, noun: str) -> str:
    """``1 env``, ``1,024 envs``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def progress_line(text: str) -> None:
    """A progress line on stderr when it is a terminal (a person waiting); a log or a pipe gets the results and
    at most one error line."""
    if sys.stderr.isatty():
        print(text, file=sys.stderr, flush=True)
