"""``packrl inspect CHECKPOINT``: a checkpoint's metadata, layouts and tensor table, without loading it.

Reads ``metadata.json`` and the safetensors header with the standard library (no torch, no numpy), checks
both hashes, and prints. Nothing in the checkpoint is imported, called or allocated. Exit status: 0 when
the hashes match, 1 when they do not, 2 when the folder is not a readable checkpoint.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

SUMMARY_FIELDS = ("format", "env_id", "seed", "global_step", "iteration", "created", "sha256", "weights_sha256")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder (metadata.json + model.safetensors), or a run folder "
                        "(its newest checkpoint)")
    parser.add_argument("--json", action="store_true", help="print metadata and tensors as one JSON object")


def run(args: argparse.Namespace) -> int:
    return inspect_command(args.checkpoint, as_json=args.json)


def main(argv: list[str] | None = None) -> int:
    """``packrl inspect`` on its own parser: the ``packrl`` command dispatches here before it builds its
    full parser (which imports torch)."""
    parser = _Parser(prog="packrl inspect", description=__doc__.split("\n")[0], allow_abbrev=False)
    add_arguments(parser)
    args = parser.parse_args(argv)
    from packrl.errors import PackrlError

    try:
        return run(args)
    except PackrlError as err:
        print(f"packrl inspect: {err}", file=sys.stderr)
        return 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")  # one line, exit 2


def inspect_command(checkpoint: str, as_json: bool = False) -> int:
    from packrl.checkpoint import WEIGHTS, CheckpointError, checkpoint_folder, read_header, read_metadata, verify
    from packrl.run_folders import checkpoint_in

    given, checkpoint = checkpoint, str(checkpoint_in(checkpoint))
    if checkpoint != given and not as_json:
        print(f"checkpoint: {checkpoint}")
    metadata = read_metadata(checkpoint)
    tensors, _ = read_header(checkpoint_folder(checkpoint) / WEIGHTS)
    try:
        verify(checkpoint)
        problem = None
    except CheckpointError as err:
        problem = str(err)
    if as_json:
        print(json.dumps({"metadata": metadata, "hashes_match": problem is None, "problem": problem,
                          "tensors": {t.name: {"dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes}
                                      for t in tensors.values()}}, indent=2))
    else:
        _print(checkpoint, metadata, tensors, problem)
    return 0 if problem is None else 1


def _print(checkpoint: str, metadata: dict, tensors: dict, problem: str | None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    summary = Table(title=escape(f"checkpoint {checkpoint}"), show_header=False)
    summary.add_column("field", style="bold")
    summary.add_column("value", overflow="fold")
    for key in SUMMARY_FIELDS:
        if key in metadata:
            summary.add_row(key, escape(_text(metadata[key])))
    summary.add_row("hashes", "[green]match[/green]" if problem is None else f"[red]{escape(problem)}[/red]")
    for key, value in metadata.items():
        if key not in SUMMARY_FIELDS and key not in ("layouts", "optimizer"):
            summary.add_row(key, escape(_text(value)))
    if metadata.get("optimizer") is not None:
        groups = metadata["optimizer"].get("param_groups", []) if isinstance(metadata["optimizer"], dict) else []
        summary.add_row("optimizer", escape(f"{len(groups)} param group(s): "
                                            + _text([{k: v for k, v in g.items() if k != 'params'} for g in groups
                                                     if isinstance(g, dict)])))
    console.print(summary)
    for name, layout in (metadata.get("layouts") or {}).items():
        console.print(_layout_table(name, layout, escape))
    table = Table(title=f"tensors in {len(tensors)} entries")
    for column in ("name", "dtype", "shape", "bytes"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    for info in tensors.values():
        table.add_row(escape(info.name), info.dtype, escape(str(list(info.shape))), f"{info.nbytes:,}")
    total = sum(info.nbytes for info in tensors.values())
    policy = sum(info.nbytes for info in tensors.values() if not info.name.startswith("optimizer/"))
    table.caption = f"{total:,} bytes ({policy:,} policy, {total - policy:,} optimizer)"
    console.print(table)


def _layout_table(name: str, layout: Any, escape: Any) -> Any:
    from rich.table import Table

    from packrl.checkpoint import leaf_name

    leaves = layout.get("leaves", []) if isinstance(layout, dict) else []
    table = Table(title=escape(f"{name} layout: {layout.get('nbytes', '?') if isinstance(layout, dict) else '?'} "
                               f"bytes, {len(leaves)} leaves"))
    for column in ("path", "field", "dtype", "shape", "offset"):
        table.add_column(column)
    for leaf in leaves:
        if isinstance(leaf, dict):
            table.add_row(escape(leaf_name(leaf.get("path"))), escape(_text(leaf.get("field"))),
                          escape(_text(leaf.get("dtype"))), escape(_text(leaf.get("shape"))),
                          escape(_text(leaf.get("offset"))))
    return table


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
