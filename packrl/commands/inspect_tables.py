"""``packrl inspect``'s tables (rich): the checkpoint's summary, its layouts and its tensors. Every text from the
files is shown through ``_text``: control characters escaped, cut to FIELD_CHARS unless ``--full``."""
from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from packrl.checkpoint import leaf_name
from packrl.commands.arguments import FIELD_CHARS
from packrl.run_folders import printable

SUMMARY_FIELDS = ("format", "env_id", "seed", "global_step", "iteration", "created", "sha256", "weights_sha256")


def print_checkpoint(checkpoint: str, metadata: dict, tensors: dict, problem: str | None, full: bool = False) -> None:
    """The summary table (``problem``: why the hashes do not match, or None), one table per layout and the
    tensor table; fields too long for a table printed plainly after it with ``full``."""
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
