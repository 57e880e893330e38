"""A run's ``history.jsonl``: one JSON object per finished iteration, written line by line and read back with
every line and the file bounded in size. Torch-free (``packrl plot`` reads it without importing torch)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from packrl.run_folders import open_append, write_file


def history_line(stats: dict) -> str:
    """One JSON line; a non-finite float is kept as the string "nan", "inf" or "-inf" (JSON has no NaN)."""
    return json.dumps({k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in stats.items()})


MAX_HISTORY_LINE = 1 << 20
"""A history.jsonl line longer than this (bytes) is not read back (packrl writes lines of a few hundred)."""


def read_history(path: Path) -> list[dict]:
    """The rows of a history.jsonl. A line that is not a JSON object of bounded size and depth (a file edited
    or truncated by a crash) is left out, as are the lines after it."""
    from packrl.checkpoint import CheckpointError, loads_bounded

    if not path.is_file():
        return []
    rows = []
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = loads_bounded(line, path, "history line", max_bytes=MAX_HISTORY_LINE, max_depth=8)
            except CheckpointError:
                break
            if not isinstance(row, dict):
                break
            rows.append({k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in row.items()})
    return rows


class History:
    """history.jsonl written line by line as iterations end (a crash keeps every finished iteration): rewritten
    atomically when opened, then appended to through a descriptor that was not opened through a symlink."""

    def __init__(self, path: Path | None, keep_until_iteration: int | None = None):
        self.path, self.file = path, None
        self.rows = []
        if path is None:  # a rank other than 0 of a data-parallel run: rows kept, nothing written
            return
        self.rows = read_history(path) if keep_until_iteration is not None else []
        if keep_until_iteration is not None:  # a resumed run drops what came after its checkpoint
            self.rows = [r for r in self.rows if r.get("iteration", 0) <= keep_until_iteration]
        write_file(path.parent, path.name, "".join(history_line(r) + "\n" for r in self.rows))
        self.file = open_append(path.parent, path.name)

    def append(self, stats: dict) -> None:
        self.rows.append(stats)
        if self.file is not None:
            self.file.write(history_line(stats) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
