"""Run folders and the checkpoints in them, found without torch (``packrl inspect`` must not import it).

A run folder holds ``checkpoint/`` (the latest save), ``checkpoints/step-*`` (periodic saves) and
``history.jsonl``; commands that take a checkpoint also take its run folder."""
from __future__ import annotations

from pathlib import Path

from packrl.errors import PackrlError


class RunError(PackrlError, ValueError):
    """A run folder or a checkpoint to resume from cannot be used as asked."""


def is_run_folder(folder: Path) -> bool:
    return folder.is_dir() and not folder.is_symlink() and any(
        (folder / name).exists() for name in ("checkpoint", "checkpoints", "history.jsonl"))


def find_checkpoint(path: str | Path, what: str = "--resume") -> tuple[Path, Path | None]:
    """``(checkpoint folder, run folder or None)`` for ``--resume`` (``what`` names the argument in errors):
    a run folder gives its newest loadable checkpoint (``checkpoint/``, else the newest of ``checkpoints/``);
    a checkpoint folder gives itself, in the run folder that holds it if any."""
    from packrl.checkpoint import CheckpointError, read_metadata

    path = Path(path)
    if not path.exists():
        raise RunError(f"{what} {path}: no such run or checkpoint folder")
    if (path / "metadata.json").is_file():
        parent = path.parent
        run = parent.parent if parent.name == "checkpoints" else parent if path.name == "checkpoint" else None
        return path, run if run is not None and is_run_folder(run) else None
    candidates = [path / "checkpoint"] + sorted((path / "checkpoints").glob("step-*"), reverse=True)
    readable = []
    for candidate in candidates:
        try:
            readable.append((int(read_metadata(candidate).get("global_step", -1)), candidate))
        except (CheckpointError, OSError, ValueError):
            continue
    if not readable:
        raise RunError(f"{what} {path}: no loadable checkpoint in it (looked at checkpoint/ and checkpoints/step-*)")
    return max(readable, key=lambda item: item[0])[1], path


def checkpoint_in(path: str | Path) -> Path:
    """The checkpoint folder that a command's CHECKPOINT argument names: a run folder's newest loadable
    checkpoint (``find_checkpoint``), or ``path`` as given, for the loader to refuse by name if it is none.
    Errors name the argument (``checkpoint PATH: ...``); the command prefixes its own name."""
    path = Path(path)
    return find_checkpoint(path, "checkpoint")[0] if is_run_folder(path) else path
