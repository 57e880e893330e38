"""A run's ``history.jsonl``: one JSON object per finished iteration, written line by line and read back with
every line and the file bounded in size. Torch-free (``packrl plot`` reads it without importing torch)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from packrl.checkpoint import CheckpointError, loads_bounded
from packrl.run_folders import open_append, write_file


def history_line(stats: dict) -> str:
    """One JSON line; a non-finite float is kept as the string "nan", "inf" or "-inf" (JSON has no NaN)."""
    return json.dumps({k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in stats.items()})


MAX_HISTORY_LINE = 1 << 20
"""A history.jsonl line longer than this (bytes) is not read back (packrl writes lines of a few hundred)."""
MAX_HISTORY_BYTES = 1 << 30
"""A history.jsonl is read up to this many bytes (about two million iterations); the rest is left out, said."""


@dataclass
class HistoryRead:
    """The rows of a history.jsonl, and why reading stopped early (None when every line was read)."""

    rows: list[dict]
    stopped: str | None = None


def read_history(path: Path) -> list[dict]:
    """The rows of a history.jsonl (``read_history_rows``, its reason for stopping early dropped)."""
    return read_history_rows(path).rows


def read_history_rows(path: Path, max_bytes: int = MAX_HISTORY_BYTES) -> HistoryRead:
    """The rows of a history.jsonl, read as a stream: at most ``MAX_HISTORY_LINE`` bytes of any line and
    ``max_bytes`` of the file are ever held. A line that is not a JSON object of bounded size and depth (a
    file edited or truncated by a crash) ends the reading: it and the lines after it are left out, and
    ``stopped`` says which line and why. The strings "nan", "inf" and "-inf" read back as floats."""
    if not path.is_file():
        return HistoryRead([])
    rows: list[dict] = []
    read = number = 0
    with open(path, "rb") as f:
        while True:
            number += 1
            line = f.readline(MAX_HISTORY_LINE + 1)
            if not line:
                return HistoryRead(rows)
            read += len(line)
            if read > max_bytes:
                return HistoryRead(rows, f"line {number}: past the first {max_bytes:,} bytes packrl reads of a history")
            if len(line) > MAX_HISTORY_LINE:
                return HistoryRead(rows, f"line {number}: longer than the {MAX_HISTORY_LINE:,} bytes packrl reads "
                                         "of a history line")
            if not line.strip():
                continue
            try:
                row = loads_bounded(line, f"line {number}", "history line", max_bytes=MAX_HISTORY_LINE, max_depth=8)
            except CheckpointError as err:
                return HistoryRead(rows, str(err))
            if not isinstance(row, dict):
                return HistoryRead(rows, f"line {number}: a JSON {type(row).__name__}, not an object")
            rows.append({k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in row.items()})


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
