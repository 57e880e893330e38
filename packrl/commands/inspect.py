"""``packrl inspect CHECKPOINT``: print a checkpoint's metadata, layouts and tensor table without loading it.

Reads ``metadata.json`` and the safetensors header with the standard library (no torch, no numpy), checks
both hashes, and prints. Nothing in the checkpoint is imported, called or allocated. Every text read from the
files is printed with its control characters and lone surrogates escaped (``\\x1b``, ``\\ud800``), long fields
shortened (``--full`` prints them whole) and the RNG states of ``resume`` as a SHA-256 digest (``--full``: as
stored). ``--json`` prints strict JSON (RFC 8259): a non-finite number as the string "NaN", "Infinity" or
"-Infinity". Exit status: 0 when the hashes match, 1 when they do not, 2 when the folder is not a readable
checkpoint.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

from packrl.checkpoint import WEIGHTS, CheckpointError, checkpoint_folder, read_header, read_metadata, verify
from packrl.commands.arguments import FIELD_CHARS, description
from packrl.errors import PackrlError
from packrl.printing import strict_json
from packrl.run_folders import checkpoint_in, error_line, printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder (metadata.json + model.safetensors), or a run folder "
                        "(its newest checkpoint)")
    parser.add_argument("--json", action="store_true", help="print metadata and tensors as one strict JSON object "
                        "(RFC 8259, ASCII: control characters and lone surrogates as \\u escapes; a non-finite number "
                        "as the string \"NaN\", \"Infinity\" or \"-Infinity\")")
    parser.add_argument("--full", action="store_true", help="print long fields whole and the RNG states as stored "
                        "(default: cut to %d characters, RNG states as a SHA-256 digest)" % FIELD_CHARS)


def run(args: argparse.Namespace) -> int:
    return inspect_command(args.checkpoint, as_json=args.json, full=args.full)


def main(argv: list[str] | None = None) -> int:
    """``packrl inspect`` on its own parser: the ``packrl`` command dispatches here before it builds its
    full parser (which imports torch)."""
    parser = _Parser(prog="packrl inspect", description=description(__doc__), allow_abbrev=False)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except PackrlError as err:
        print(f"packrl inspect: {error_line(err)}", file=sys.stderr)
        return 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")  # one line, exit 2


def inspect_command(checkpoint: str, as_json: bool = False, full: bool = False) -> int:
    given = checkpoint
    found = checkpoint_in(checkpoint)
    checkpoint, skipped = str(found.checkpoint), found.skipped
    if checkpoint != given and not as_json:
        print(printable(f"checkpoint: {checkpoint}"))
    for line in skipped:
        print(printable(f"skipped {line}"), file=sys.stderr)
    metadata = read_metadata(checkpoint)
    tensors, _ = read_header(checkpoint_folder(checkpoint) / WEIGHTS)
    try:
        verify(found.verified or checkpoint)  # a run folder's newest was verified when it was chosen
        problem = None
    except CheckpointError as err:
        problem = str(err)
    shown = metadata if full else {**metadata, "resume": _rng_digests(metadata["resume"])} if "resume" in metadata \
        else metadata
    if as_json:  # strict JSON, ASCII: every control character and lone surrogate is an escape
        print(strict_json({"metadata": shown, "hashes_match": problem is None, "problem": problem, "skipped": skipped,
                           "tensors": {t.name: {"dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes}
                                       for t in tensors.values()}}, indent=2))
    else:
        from packrl.commands.inspect_tables import print_checkpoint  # rich: only for the tables

        print_checkpoint(checkpoint, shown, tensors, problem, full)
    return 0 if problem is None else 1


def _rng_digests(resume: Any) -> Any:
    """``resume`` with each RNG state replaced by ``sha256:<first 16 hex digits> (<n> bytes of JSON)``."""
    if not isinstance(resume, dict) or not isinstance(resume.get("rng"), dict):
        return resume
    return {**resume, "rng": {name: _digest(state) for name, state in resume["rng"].items()}}


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return f"sha256:{hashlib.sha256(text).hexdigest()[:16]} ({len(text):,} bytes of JSON; --full shows it)"
