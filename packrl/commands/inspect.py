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

from packrl.checkpoint import WEIGHTS, CheckpointError, checkpoint_folder, leaf_name, read_header, read_metadata, verify
from packrl.commands.arguments import description
from packrl.errors import PackrlError
from packrl.printing import strict_json
from packrl.run_folders import checkpoint_in, printable

SUMMARY_FIELDS = ("format", "env_id", "seed", "global_step", "iteration", "created", "sha256", "weights_sha256")
FIELD_CHARS = 400
"""A field printed longer than this is cut (its length said) unless --full."""


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
        from packrl.run_folders import error_line

        print(f"packrl inspect: {error_line(err)}", file=sys.stderr)
        return 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")  # one line, exit 2


def inspect_command(checkpoint: str, as_json: bool = False, full: bool = False) -> int:
    given = checkpoint
    found, skipped = checkpoint_in(checkpoint)
    checkpoint = str(found)
    if checkpoint != given and not as_json:
        print(printable(f"checkpoint: {checkpoint}"))
    for line in skipped:
        print(printable(f"skipped {line}"), file=sys.stderr)
    metadata = read_metadata(checkpoint)
    tensors, _ = read_header(checkpoint_folder(checkpoint) / WEIGHTS)
    try:
        verify(checkpoint)
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
        _print(checkpoint, shown, tensors, problem, full)
    return 0 if problem is None else 1


def _rng_digests(resume: Any) -> Any:
    """``resume`` with each RNG state replaced by ``sha256:<first 16 hex digits> (<n> bytes of JSON)``."""
    if not isinstance(resume, dict) or not isinstance(resume.get("rng"), dict):
        return resume
    return {**resume, "rng": {name: _digest(state) for name, state in resume["rng"].items()}}


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return f"sha256:{hashlib.sha256(text).hexdigest()[:16]} ({len(text):,} bytes of JSON; --full shows it)"


def _print(checkpoint: str, metadata: dict, tensors: dict, problem: str | None, full: bool = False) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    below: list[tuple[str, str]] = []  # --full: fields too long to lay out in a table, printed plainly after it

    def shown(value: Any, name: str = "") -> str:
        text = _text(value, full)
        if full and len(text) > FIELD_CHARS and name:
            below.append((name, text))
            return escape(f"({len(text):,} characters, printed in full below the table)")
        return escape(text)

    summary = Table(title=escape(printable(f"checkpoint {checkpoint}")), show_header=False)
    summary.add_column("field", style="bold")
    summary.add_column("value", overflow="fold")
    for key in SUMMARY_FIELDS:
        if key in metadata:
            summary.add_row(key, shown(metadata[key], key))
    summary.add_row("hashes", "[green]match[/green]" if problem is None else f"[red]{escape(printable(problem))}[/red]")
    for key, value in metadata.items():
        if key not in SUMMARY_FIELDS and key not in ("layouts", "optimizer"):
            summary.add_row(escape(_text(key, full)), shown(value, _text(key, full)))
    if metadata.get("optimizer") is not None:
        groups = metadata["optimizer"].get("param_groups", []) if isinstance(metadata["optimizer"], dict) else []
        groups = groups if isinstance(groups, list) else []  # a hostile file's param_groups may be anything
        summary.add_row("optimizer", escape(f"{len(groups)} param group(s): ") + shown(
            [{k: v for k, v in g.items() if k != 'params'} for g in groups if isinstance(g, dict)]))
    console.print(summary)
    for name, text in below:  # rich would take minutes to fold megabytes into a cell
        sys.stdout.write(f"{name}:\n{text}\n")
    sys.stdout.flush()
    for name, layout in (metadata.get("layouts") or {}).items():
        console.print(_layout_table(name, layout, escape, full))
    table = Table(title=f"tensors in {len(tensors)} entries")
    for column in ("name", "dtype", "shape", "bytes"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    for info in tensors.values():
        table.add_row(escape(printable(info.name)), info.dtype, escape(str(list(info.shape))), f"{info.nbytes:,}")
    total = sum(info.nbytes for info in tensors.values())
    policy = sum(info.nbytes for info in tensors.values() if not info.name.startswith("optimizer/"))
    table.caption = f"{total:,} bytes ({policy:,} policy, {total - policy:,} optimizer)"
    console.print(table)


def _layout_table(name: str, layout: Any, escape: Any, full: bool = False) -> Any:
    from rich.table import Table

    leaves = layout.get("leaves", []) if isinstance(layout, dict) else []
    leaves = leaves if isinstance(leaves, list) else []
    nbytes = layout.get("nbytes", "?") if isinstance(layout, dict) else "?"
    counted = f"{len(leaves)} {'leaf' if len(leaves) == 1 else 'leaves'}"
    table = Table(title=escape(_text(f"{name} layout: {_text(nbytes, full)} bytes, {counted}", full)))
    for column in ("path", "field", "dtype", "shape", "offset"):
        table.add_column(column)
    for leaf in leaves:
        if isinstance(leaf, dict):
            table.add_row(escape(_text(leaf_name(leaf.get("path")), full)),
                          *(escape(_text(leaf.get(k), full)) for k in ("field", "dtype", "shape", "offset")))
    return table


def _text(value: Any, full: bool = False) -> str:
    """A field as printed: strings as they are, anything else as JSON; control characters escaped; cut to
    FIELD_CHARS characters unless ``full`` (cut before it is escaped or laid out, so a 16 MB field costs
    what its first characters do)."""
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    if not full and len(value) > FIELD_CHARS:
        value = f"{value[:FIELD_CHARS]}... ({len(value):,} characters; --full prints all)"
    return printable(value)
