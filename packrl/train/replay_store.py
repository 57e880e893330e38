"""Save and load a ReplayBuffer in the checkpoint's safe format: one folder,

    buffer/
      replay.safetensors   every array (storage, the set of starts, the sum trees), no pickle
      replay.json          shapes, dtypes, gamma, layout, priority settings, the RNG's state, and the
                           SHA-256 of replay.safetensors, checked before a single array is read

Nothing in the files chooses code: dtypes must be plain numeric names, the RNG's bit generator one of
NumPy's by name from a fixed table, the layout plain data.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from packrl.checkpoint import CheckpointError, sha256_file

FORMAT = "packrl.replay/1"
ARRAYS, METADATA = "replay.safetensors", "replay.json"
STATE = ("observations", "actions", "rewards", "discounts", "last", "ptr", "count", "starts", "where", "held",
         "sums", "mins", "stamps", "clock")
BIT_GENERATORS = {"PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM, "Philox": np.random.Philox,
                  "SFC64": np.random.SFC64, "MT19937": np.random.MT19937}


def save_buffer(buffer: Any, path: str | Path) -> Path:
    from safetensors.numpy import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    arrays = path / ARRAYS
    tmp = arrays.with_suffix(".tmp")
    save_file({name: np.ascontiguousarray(getattr(buffer, name)) for name in STATE}, str(tmp))
    tmp.replace(arrays)  # a crash mid-write never leaves a half file under the real name
    metadata = {
        "format": FORMAT,
        "sha256": sha256_file(arrays),
        "capacity": buffer.capacity,
        "num_rows": buffer.num_rows,
        "observation_shape": list(buffer.observations.shape[2:]),
        "observation_dtype": buffer.observations.dtype.str,
        "action_shape": list(buffer.actions.shape[2:]),
        "action_dtype": buffer.actions.dtype.str,
        "gamma": buffer.gamma,
        "layout": None if buffer.layout is None else buffer.layout.to_dict(),
        "prioritized": buffer.prioritized,
        "alpha": buffer.alpha,
        "beta": buffer.beta,
        "priority_eps": buffer.priority_eps,
        "max_priority": buffer.max_priority,
        "rng": buffer.rng.bit_generator.state,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (path / METADATA).write_text(json.dumps(metadata, indent=2))
    return path


def load_buffer(cls: type, path: str | Path) -> Any:
    from safetensors.numpy import load_file

    path = Path(path)
    metadata = _read_metadata(path)
    arrays = path / ARRAYS
    if not arrays.is_file():
        raise CheckpointError(f"{path}: {ARRAYS} is missing")
    actual = sha256_file(arrays)
    if actual != metadata["sha256"]:
        raise CheckpointError(f"{arrays}: SHA-256 {actual} does not match {METADATA}'s {metadata['sha256']}; the file "
                              "was changed or corrupted after it was saved")
    layout = None
    if metadata["layout"] is not None:
        from packrl.emulation.layout import Layout

        try:
            layout = Layout.from_dict(metadata["layout"])
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{path / METADATA}: field 'layout' is not a packrl layout ({err})") from None
    try:
        buffer = cls(metadata["capacity"], metadata["num_rows"], tuple(metadata["observation_shape"]),
                     _dtype(metadata, "observation_dtype", path), tuple(metadata["action_shape"]),
                     _dtype(metadata, "action_dtype", path), gamma=metadata["gamma"], layout=layout,
                     prioritized=metadata["prioritized"], alpha=metadata["alpha"], beta=metadata["beta"],
                     priority_eps=metadata["priority_eps"])
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{path / METADATA}: {err}") from None
    stored = load_file(str(arrays))
    for name in STATE:
        mine = getattr(buffer, name)
        if name not in stored:
            raise CheckpointError(f"{arrays}: array {name!r} is missing")
        if stored[name].shape != mine.shape or stored[name].dtype != mine.dtype:
            raise CheckpointError(f"{arrays}: array {name!r} is {stored[name].dtype} {stored[name].shape}, the metadata "
                                  f"makes it {mine.dtype} {mine.shape}")
        mine[...] = stored[name]
    _check_index(buffer, arrays)
    buffer.max_priority = float(metadata["max_priority"])
    buffer.rng = np.random.Generator(_bit_generator(metadata["rng"], path))
    return buffer


def _check_index(buffer: Any, arrays: Path) -> None:
    """The index arrays are read by Numba without bounds checks: refuse any that point outside the buffer or
    disagree with each other (checked in order, each check relying on the ones before)."""
    slots, held = buffer.capacity * buffer.num_rows, int(buffer.held[0])
    starts = buffer.starts[:max(0, min(held, slots))]
    checks = [
        ("ptr", lambda: np.all((buffer.ptr >= 0) & (buffer.ptr < buffer.capacity))),
        ("count", lambda: np.all((buffer.count >= 0) & (buffer.count <= buffer.capacity))),
        ("held", lambda: 0 <= held <= slots),
        ("starts", lambda: np.all((starts >= 0) & (starts < slots))),
        ("where", lambda: np.all((buffer.where >= -1) & (buffer.where < held))
         and np.array_equal(buffer.where[starts], np.arange(held)) and np.count_nonzero(buffer.where >= 0) == held),
    ]
    if buffer.prioritized:
        checks.append(("sums", lambda: _tree_consistent(buffer.sums, buffer.mins, buffer.where, slots)))
    for name, ok in checks:
        if not ok():
            raise CheckpointError(f"{arrays}: array {name!r} is inconsistent with the buffer it describes")


def _tree_consistent(sums: np.ndarray, mins: np.ndarray, where: np.ndarray, slots: int) -> bool:
    """Leaves positive exactly at the starts, and every parent the sum (and min) of its children."""
    size = sums.size // 2
    leaves = sums[size:]
    if not (np.all(np.isfinite(leaves)) and np.array_equal(leaves[:slots] > 0, where >= 0) and not leaves[slots:].any()):
        return False
    if not np.array_equal(mins[size:], np.where(leaves > 0, leaves, np.inf)):
        return False
    level = size
    while level > 1:
        parents = np.arange(level // 2, level)
        if not (np.array_equal(sums[parents], sums[2 * parents] + sums[2 * parents + 1])
                and np.array_equal(mins[parents], np.minimum(mins[2 * parents], mins[2 * parents + 1]))):
            return False
        level //= 2
    return True


def _read_metadata(path: Path) -> dict:
    file = path / METADATA
    if not file.is_file():
        raise CheckpointError(f"{path}: no {METADATA} (is this a saved packrl replay buffer?)")
    try:
        metadata = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        got = metadata.get("format") if isinstance(metadata, dict) else type(metadata).__name__
        raise CheckpointError(f"{file}: format {got!r}, expected {FORMAT!r}")
    fields = {"sha256": str, "capacity": int, "num_rows": int, "observation_shape": list, "observation_dtype": str,
              "action_shape": list, "action_dtype": str, "gamma": (int, float), "prioritized": bool,
              "alpha": (int, float), "beta": (int, float), "priority_eps": (int, float), "max_priority": (int, float),
              "rng": dict}
    for name, kind in fields.items():
        if not isinstance(metadata.get(name), kind) or (kind is int and isinstance(metadata[name], bool)):
            raise CheckpointError(f"{file}: field {name!r} is missing or not a {getattr(kind, '__name__', 'number')}")
    for name in ("observation_shape", "action_shape"):
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in metadata[name]):
            raise CheckpointError(f"{file}: field {name!r} must be a list of non-negative ints, got {metadata[name]}")
    if "layout" not in metadata or not (metadata["layout"] is None or isinstance(metadata["layout"], dict)):
        raise CheckpointError(f"{file}: field 'layout' must be null or a layout object")
    return metadata


def _dtype(metadata: dict, name: str, path: Path) -> np.dtype:
    """A plain numeric dtype from its ``dtype.str`` (e.g. '|u1', '<f4'); nothing else."""
    text = metadata[name]
    try:
        dtype = np.dtype(text)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biuf" or dtype.str != text:
        raise CheckpointError(f"{path / METADATA}: field {name!r} must be a numeric dtype string such as '<f4', got {text!r}")
    return dtype


def _bit_generator(state: dict, path: Path) -> np.random.BitGenerator:
    name = state.get("bit_generator")
    if name not in BIT_GENERATORS:
        raise CheckpointError(f"{path / METADATA}: field 'rng' names bit generator {name!r}; "
                              f"one of {sorted(BIT_GENERATORS)} expected")
    generator = BIT_GENERATORS[name]()
    try:
        generator.state = state
    except (ValueError, TypeError, KeyError) as err:
        raise CheckpointError(f"{path / METADATA}: field 'rng' is not a {name} state ({err})") from None
    return generator
