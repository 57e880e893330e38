"""Run folders and the checkpoints in them, found without torch (``packrl inspect`` must not import it).

A run folder holds ``checkpoint/`` (the latest save), ``checkpoints/step-*`` (periodic saves),
``history.jsonl``, ``learning_curve.png`` and ``.packrl-run``, the marker that says packrl made the folder;
commands that take a checkpoint also take its run folder.

Containment: a run ``--name`` is one path component; ``--overwrite`` deletes only a folder with the marker
(or, for folders made before the marker existed, one that holds nothing but packrl's own files), never the
current folder or one above it. Every file packrl writes into a run folder goes through ``write_file`` (or
``open_append`` for the history, a file first made by ``write_file``): no path component below the run folder
may be a symlink, and a file is written into a fresh temporary sibling and renamed into place.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import IO, NamedTuple

from packrl.checkpoint import CheckpointError, Verified, read_metadata, verify
from packrl.errors import PackrlError
from packrl.printing import shown

MARKER = ".packrl-run"
"""The file packrl writes into every run folder it creates; ``--overwrite`` deletes only folders that hold it."""
RUN_FILES = frozenset({MARKER, "checkpoint", "checkpoints", "history.jsonl", "learning_curve.png", "tensorboard",
                       "wandb", ".checkpoint.previous"})
"""What packrl itself puts into a run folder (an older folder holding only these counts as a packrl run)."""
NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")


class RunError(PackrlError, ValueError):
    """A run folder or a checkpoint to resume from cannot be used as asked."""


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates escaped (``packrl.printing.shown``)."""
    return shown(text)


def error_line(err: BaseException) -> str:
    """An error as one printable line: its text with line breaks joined, or, for an error carrying an env's
    traceback, its first line and the traceback's last (the exception the env raised)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if len(lines) > 1 and (getattr(err, "env_traceback", None) or any(ln.startswith("Traceback") for ln in lines)):
        text = f"{lines[0].rstrip(':')}: {lines[-1]}"
    else:
        text = " ".join(lines) or type(err).__name__
    return printable(text)


def check_name(name: str) -> str:
    """``name`` when it is one path component of letters, digits, '.', '_' and '-' (not '.' or '..'), else RunError."""
    if not NAME.fullmatch(name) or name in (".", ".."):
        raise RunError(f"--name {name!r}: a run name is one folder name of letters, digits, '.', '_' and '-' "
                       "(not '.' or '..'); use --out DIR for a folder elsewhere")
    return name


def is_packrl_run(folder: Path) -> bool:
    """True when ``folder`` holds packrl's marker file (a regular file, not a symlink)."""
    marker = folder / MARKER
    return folder.is_dir() and not folder.is_symlink() and marker.is_file() and not marker.is_symlink()


def foreign_entries(folder: Path) -> list[str]:
    """The names in ``folder`` that packrl does not write into a run folder (temporary files of its saves aside)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in RUN_FILES and not _is_packrl_temporary(p.name))


def _is_packrl_temporary(name: str) -> bool:
    return name.startswith((".checkpoint.tmp-", f".{MARKER}.tmp-", ".history.jsonl.tmp-", ".learning_curve.png.tmp-"))


def mark(folder: Path) -> None:
    """Write the marker into ``folder`` (a run folder packrl created, or an older one it adopts on --resume)."""
    if not (folder / MARKER).is_file() or (folder / MARKER).is_symlink():
        write_file(folder, MARKER, json.dumps({"packrl_run": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")


def create_run_folder(folder: Path, *, exist_ok: bool = False) -> Path:
    """Make ``folder`` (its parents as needed) and mark it as a packrl run."""
    if folder.is_symlink():
        raise RunError(f"run folder {folder}: is a symlink; a run folder is never written through a symlink")
    folder.mkdir(parents=True, exist_ok=exist_ok)
    mark(folder)
    return folder


def remove_run_folder(folder: Path) -> None:
    """Delete an existing run folder for ``--overwrite``, after checking it is a packrl run and neither the
    current folder nor one above it."""
    if folder.is_symlink():
        raise RunError(f"--overwrite: {folder} is a symlink; refusing to delete through it")
    if not folder.is_dir():
        raise RunError(f"--overwrite: {folder} exists and is not a folder; refusing to delete it")
    here, target = Path.cwd().resolve(), folder.resolve()
    if here == target or target in here.parents:
        raise RunError(f"--overwrite: {folder} is the current folder or one above it; refusing to delete it")
    if not is_packrl_run(folder):
        others = foreign_entries(folder)
        if others or not is_run_folder(folder):
            what = f"it holds {', '.join(others[:5])}" if others else "no checkpoint or history.jsonl"
            raise RunError(f"--overwrite: {folder} is not a packrl run folder (no {MARKER} marker; {what}); "
                           "refusing to delete it")
    shutil.rmtree(folder)


# ---------------------------------------------------------------- writing into a run folder


def inside(folder: Path, relative: str | Path) -> Path:
    """``folder / relative`` after checking that ``relative`` stays below ``folder`` and that neither ``folder``
    nor any component below it is a symlink (the file itself may not exist yet)."""
    relative = Path(relative)
    if relative.is_absolute() or not relative.parts or any(part in ("", ".", "..") for part in relative.parts):
        raise RunError(f"{folder}: {str(relative)!r} is not a path inside the run folder")
    path = folder
    for part in (None, *relative.parts):
        if part is not None:
            path = path / part
        if path.is_symlink():
            raise RunError(f"{path}: is a symlink; packrl never writes into a run folder through a symlink")
    return path


def write_file(folder: str | Path, relative: str | Path, data: bytes | str) -> Path:
    """Write ``data`` to ``folder/relative`` atomically: into a fresh temporary sibling (created exclusively,
    never through a symlink), flushed, then renamed over the target. Refuses (RunError) a symlink anywhere
    below ``folder`` on the way, ``folder`` itself included; creates missing subfolders."""
    folder = Path(folder)
    path = inside(folder, relative)
    path.parent.mkdir(parents=True, exist_ok=True)
    inside(folder, relative)  # a component made a symlink in between
    if path.is_dir():
        raise RunError(f"{path}: is a folder; refusing to replace it with a file")
    raw = data.encode() if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a name, never follows one
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def open_append(folder: str | Path, relative: str | Path) -> IO[str]:
    """``folder/relative`` opened for appending text, never through a symlink (the file must exist: make it
    with ``write_file``). Each ``write`` of a line is one append."""
    path = inside(Path(folder), relative)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
    except OSError as err:
        raise RunError(f"{path}: cannot be opened for appending ({err.strerror})") from None
    return os.fdopen(fd, "a")


def fresh_subfolder(folder: str | Path, name: str) -> Path:
    """A new, empty subfolder ``folder/name`` (``name-2``, ``name-3``, ... when taken) for a third-party logger,
    which then writes only inside it."""
    folder = Path(folder)
    inside(folder, name)
    folder.mkdir(parents=True, exist_ok=True)
    candidate, n = folder / name, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            candidate = folder / f"{name}-{n}"


def is_run_folder(folder: Path) -> bool:
    return folder.is_dir() and not folder.is_symlink() and any(
        (folder / name).exists() for name in (MARKER, "checkpoint", "checkpoints", "history.jsonl"))


def find_checkpoint(path: str | Path, what: str = "--resume") -> tuple[Path, Path | None]:
    """``(checkpoint folder, run folder or None)`` for ``--resume`` (``what`` names the argument in errors):
    a run folder gives its newest loadable checkpoint (``newest_checkpoint``); a checkpoint folder gives
    itself, in the run folder that holds it if any."""
    found = newest_checkpoint(path, what)
    return found.checkpoint, found.run


class Found(NamedTuple):
    """A checkpoint found for a command's argument (``newest_checkpoint``)."""

    checkpoint: Path
    run: Path | None  # the run folder that holds it, if any
    skipped: list[str]  # "NAME (why)" for each newer checkpoint of the run folder that does not check out
    verified: Verified | None  # as verified when chosen among a run folder's (its one hash pass); None if given


def newest_checkpoint(path: str | Path, what: str = "--resume") -> Found:
    """As ``find_checkpoint``, and the checkpoints of a run folder passed over: ``"NAME (why)"`` for each one
    newer than the chosen one (or of unknown step) whose metadata, hashes or header do not check out. The one
    chosen among a run folder's comes with what its verification read, so its caller hashes nothing again."""
    path = Path(path)
    if not path.exists():
        raise RunError(f"{what} {path}: no such run or checkpoint folder")
    if (path / "metadata.json").is_file():
        parent = path.parent
        run = parent.parent if parent.name == "checkpoints" else parent if path.name == "checkpoint" else None
        return Found(path, run if run is not None and is_run_folder(run) else None, [], None)
    candidates = [path / "checkpoint"] + sorted((path / "checkpoints").glob("step-*"), reverse=True)
    skipped, readable = [], []
    for candidate in candidates:
        if not candidate.exists() and candidate.name == "checkpoint" and not (path / ".checkpoint.previous").is_dir():
            continue
        try:
            step = read_metadata(candidate).get("global_step", -1)
            readable.append((step if type(step) is int else -1, candidate))
        except (CheckpointError, OSError, ValueError) as err:
            skipped.append(f"{_relative(candidate, path)} ({_first_line(err)})")
    readable.sort(key=lambda item: item[0], reverse=True)
    for _, candidate in readable:
        try:
            verified = verify(candidate)
        except (CheckpointError, OSError, ValueError) as err:
            skipped.append(f"{_relative(candidate, path)} ({_first_line(err)})")
            continue
        return Found(candidate, path, skipped, verified)
    if not readable and not skipped:
        raise RunError(f"{what} {path}: no checkpoint in it (looked at checkpoint/ and checkpoints/step-*)")
    raise RunError(f"{what} {path}: no loadable checkpoint in it; skipped {'; '.join(skipped[:4])}"
                   + (f" (+{len(skipped) - 4} more)" if len(skipped) > 4 else ""))


def _relative(candidate: Path, folder: Path) -> str:
    return str(candidate.relative_to(folder)) if candidate.is_relative_to(folder) else str(candidate)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def checkpoint_in(path: str | Path) -> Found:
    """The checkpoint that a command's CHECKPOINT argument names: a run folder's newest loadable checkpoint
    (``newest_checkpoint``: verified, with those passed over), or ``path`` as given, for the loader to refuse by
    name if it is none. Errors name the argument (``checkpoint PATH: ...``); the command prefixes its own name."""
    path = Path(path)
    if not path.exists():  # said as such, not as a folder that lacks metadata.json
        raise RunError(f"checkpoint {shown(str(path))}: no such folder")
    if is_run_folder(path):
        return newest_checkpoint(path, "checkpoint")
    return Found(path, None, [], None)
