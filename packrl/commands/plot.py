"""``packrl plot RUN``: draw a run's learning curve from its ``history.jsonl`` (for a run trained where
matplotlib was not installed, or to draw it again). Needs matplotlib (``pip install 'packrl[plot]'``); does
not import torch. Exit status: 0 drawn, 1 nothing to draw (no episode ended), 2 a bad folder or no matplotlib.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from packrl.commands.arguments import description
from packrl.errors import PackrlError
from packrl.history import read_history_rows
from packrl.printing import shown
from packrl.run_folders import error_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="a run folder (it holds history.jsonl)")
    parser.add_argument("--out", metavar="PNG", help="where the curve goes (default RUN/learning_curve.png)")
    parser.add_argument("--title", help="the plot's title (default: the run folder's name)")


def main(argv: list[str] | None = None) -> int:
    """``packrl plot`` on its own parser: the ``packrl`` command dispatches here before it builds its full
    parser (which imports torch)."""
    parser = _Parser(prog="packrl plot", description=description(__doc__), allow_abbrev=False)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return plot_command(args.run, args.out, args.title)


def plot_command(run: str, out: str | None = None, title: str | None = None) -> int:
    folder = Path(run)
    history = folder / "history.jsonl"
    if not folder.exists():
        return _fail(f"{run}: no such folder (give a run folder that packrl train wrote)")
    if not history.is_file():
        return _fail(f"{run}: no history.jsonl in it (give a run folder that packrl train wrote)")

    from packrl.train.plot import (  # torch: after the checks
        INSTALL,
        left_out,
        matplotlib_available,
        plot_learning_curve,
    )
    if not matplotlib_available():
        return _fail(f"drawing a curve needs matplotlib, which is not installed: {INSTALL}")
    target = Path(out) if out is not None else folder / "learning_curve.png"
    try:
        read = read_history_rows(history)
    except OSError as err:
        return _fail(f"{history}: cannot be read ({err.strerror or err})")
    stopped = read.stopped and f"{read.stopped}; it and the lines after it are left out"
    note = "; ".join(f"{history}: {why}" for why in (stopped, left_out(read.rows)) if why)
    try:
        written = plot_learning_curve(read.rows, target, title or folder.resolve().name)
    except (PackrlError, OSError) as err:
        return _fail(f"{target}: {error_line(err)}" + (f" ({note})" if note else ""))
    if written is None:
        return _fail(f"no episode ended in {history}: nothing to draw" + (f" ({note})" if note else ""), 1)
    if note:  # what the curve leaves out, one line
        print(shown(f"packrl plot: {note}"), file=sys.stderr)
    print(shown(f"learning curve: {written}"))
    return 0


def _fail(message: str, code: int = 2) -> int:
    print(shown(f"packrl plot: {message}"), file=sys.stderr)
    return code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")  # one line, exit 2
