"""Save and load a ReplayBuffer in the checkpoint's safe format: one folder,

    buffer/
      replay.safetensors   every array (storage, the set of starts, the sum trees), no pickle
      replay.json          shapes, dtypes, gamma, layout, priority and frame-stack settings, the RNG's state,
                           ``arrays_sha256`` (of replay.safetensors) and ``sha256``: the manifest hash

The manifest hash is ``packrl.checkpoint.manifest_sha256``: the SHA-256 of the canonical JSON of replay.json
without ``sha256`` itself. As replay.json holds the arrays' hash, it covers both files: every setting that
changes sampling (gamma, alpha, beta, priority_eps, max_priority, frame_stack, the RNG state, ...) is under it,
so an edit to either file is refused. Loading checks, in order, before any array is allocated: the format,
the manifest hash, each field's type and range, the arrays' hash, and the safetensors header (names, dtypes
and shapes against the ones the metadata makes). Every failure is one ``CheckpointError`` line naming the
file and the field or array.

Nothing in the files chooses code: dtypes must be plain numeric names, the RNG's bit generator one of
NumPy's by name from a fixed table, the layout plain data.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save

from packrl.checkpoint import CheckpointError, manifest_sha256, read_header, sha256_file
from packrl.emulation.layout import Layout
from packrl.run_folders import RunError, write_file

FORMAT = "packrl.replay/2"  # 1: gamma and the priority settings were outside the hash; refused with a message
ARRAYS, METADATA = "replay.safetensors", "replay.json"
STATE = ("observations", "actions", "rewards", "discounts", "last", "ptr", "count", "starts", "where", "held",
         "sums", "mins", "stamps", "clock")
BIT_GENERATORS = {"PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM, "Philox": np.random.Philox,
                  "SFC64": np.random.SFC64, "MT19937": np.random.MT19937}


def save_buffer(buffer: Any, path: str | Path) -> Path:
    """Both files through ``run_folders.write_file`` (atomic, never through a symlink), arrays first."""
    path = Path(path)
    if path.is_symlink():
        raise RunError(f"replay folder {path}: is a symlink; packrl never writes through a symlink")
    path.mkdir(parents=True, exist_ok=True)
    arrays = write_file(path, ARRAYS, save({name: np.ascontiguousarray(getattr(buffer, name)) for name in STATE}))
    metadata = {
        "format": FORMAT,
        "arrays_sha256": sha256_file(arrays),
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
        "frame_stack": buffer.frame_stack,
        "frame_stack_leaf": buffer.frame_stack_leaf,
        "rng": buffer.rng.bit_generator.state,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    metadata["sha256"] = manifest_sha256(metadata)
    write_file(path, METADATA, json.dumps(metadata, indent=2))  # a crash before this: the old hash refuses the arrays
    return path



def load_buffer(cls: type, path: str | Path) -> Any:
    path = Path(path)
    file = path / METADATA
    metadata = _read_metadata(path)
    arrays = path / ARRAYS
    if not arrays.is_file():
        raise CheckpointError(f"{path}: {ARRAYS} is missing (or not a file)")
    actual = sha256_file(arrays)
    if actual != metadata["arrays_sha256"]:
        raise CheckpointError(f"{arrays}: SHA-256 {actual} does not match {METADATA}'s arrays_sha256 "
                              f"{metadata['arrays_sha256']}; the file was changed or corrupted after it was saved")
    layout = None
    if metadata["layout"] is not None:
        try:
            layout = Layout.from_dict(metadata["layout"])
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise CheckpointError(f"{file}: field 'layout' is not a packrl layout ({_first_line(err)})") from None
    observation_dtype, action_dtype = _dtype(metadata, "observation_dtype", path), _dtype(metadata, "action_dtype", path)
    _check_header(metadata, arrays, observation_dtype, action_dtype)  # before the buffer's arrays are allocated
    try:
        buffer = cls(metadata["capacity"], metadata["num_rows"], tuple(metadata["observation_shape"]),
                     observation_dtype, tuple(metadata["action_shape"]), action_dtype, gamma=metadata["gamma"],
                     layout=layout, prioritized=metadata["prioritized"], alpha=metadata["alpha"],
                     beta=metadata["beta"], priority_eps=metadata["priority_eps"],
                     frame_stack=metadata["frame_stack"], frame_stack_leaf=metadata["frame_stack_leaf"])
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{file}: {_first_line(err)}") from None
    try:
        stored = load_file(str(arrays))
    except (SafetensorError, ValueError, OSError) as err:
        raise CheckpointError(f"{arrays}: unreadable safetensors data ({_first_line(err)})") from None
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


SAFETENSORS_DTYPES = {"b": {1: "BOOL"}, "u": {1: "U8", 2: "U16", 4: "U32", 8: "U64"},
                      "i": {1: "I8", 2: "I16", 4: "I32", 8: "I64"}, "f": {2: "F16", 4: "F32", 8: "F64"}}


def _check_header(metadata: dict, arrays: Path, observation_dtype: np.dtype, action_dtype: np.dtype) -> None:
    """The safetensors header (read alone, checked by ``packrl.checkpoint.read_header``: offsets inside the file,
    sizes that match the shapes) against the arrays the metadata makes: exactly ``STATE``, each of its dtype and
    shape. So a header that claims more than the file holds, or a metadata that asks for a buffer far larger
    than the file, is refused before anything is allocated."""
    tensors, _ = read_header(arrays)
    capacity, rows = metadata["capacity"], metadata["num_rows"]
    slots = capacity * rows
    tree = 2 * (1 << max(slots - 1, 0).bit_length()) if metadata["prioritized"] else 0
    expected = {
        "observations": (observation_dtype, (capacity, rows, *metadata["observation_shape"])),
        "actions": (action_dtype, (capacity, rows, *metadata["action_shape"])),
        "rewards": (np.dtype(np.float32), (capacity, rows)), "discounts": (np.dtype(np.float32), (capacity, rows)),
        "last": (np.dtype(bool), (capacity, rows)), "ptr": (np.dtype(np.int64), (rows,)),
        "count": (np.dtype(np.int64), (rows,)), "starts": (np.dtype(np.int64), (slots,)),
        "where": (np.dtype(np.int64), (slots,)), "held": (np.dtype(np.int64), (1,)),
        "sums": (np.dtype(np.float64), (tree,)), "mins": (np.dtype(np.float64), (tree,)),
        "stamps": (np.dtype(np.int64), (slots if metadata["prioritized"] else 0,)),
        "clock": (np.dtype(np.int64), (1,)),
    }
    for name in sorted(set(tensors) - set(expected)):
        raise CheckpointError(f"{arrays}: array {name!r} is not one a replay buffer holds")
    for name, (dtype, shape) in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{arrays}: array {name!r} is missing")
        want = SAFETENSORS_DTYPES[dtype.kind][dtype.itemsize]
        got = tensors[name]
        if got.dtype != want or got.shape != tuple(shape):
            raise CheckpointError(f"{arrays}: array {name!r} is {got.dtype} {list(got.shape)}, the metadata makes it "
                                  f"{want} {list(shape)}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


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


MAX_METADATA_BYTES = 100_000_000  # a layout of a few thousand leaves is well under 1 MB
FIELDS = {"arrays_sha256": str, "capacity": int, "num_rows": int, "observation_shape": list, "observation_dtype": str,
          "action_shape": list, "action_dtype": str, "gamma": float, "prioritized": bool, "alpha": float,
          "beta": float, "priority_eps": float, "max_priority": float, "frame_stack": int, "rng": dict}


def _read_metadata(path: Path) -> dict:
    """replay.json, parsed and checked: the format, the manifest hash, then every field's type and range."""
    file = path / METADATA
    if not file.is_file():
        raise CheckpointError(f"{path}: no {METADATA} (is this a saved packrl replay buffer?)")
    if file.stat().st_size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{file}: {file.stat().st_size} bytes, more than any replay metadata ({MAX_METADATA_BYTES})")
    try:
        metadata = json.loads(file.read_bytes(), parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as err:
        raise CheckpointError(f"{file}: not valid JSON ({_first_line(err)})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        got = metadata.get("format") if isinstance(metadata, dict) else type(metadata).__name__
        hint = "; saved by an older packrl, whose format left gamma and the priorities outside the hash: save it again" \
            if got == "packrl.replay/1" else ""
        raise CheckpointError(f"{file}: format {_short(got)}, expected {FORMAT!r}{hint}")
    if not isinstance(metadata.get("sha256"), str):
        raise CheckpointError(f"{file}: field 'sha256' is missing or not a str")
    recorded = manifest_sha256(metadata)
    if recorded != metadata["sha256"]:
        raise CheckpointError(f"{file}: field 'sha256' {_short(metadata['sha256'])} does not match the manifest hash "
                              f"{recorded}; the metadata was changed after saving")
    for name, kind in FIELDS.items():
        value = metadata.get(name)
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)) \
            if kind is float else isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise CheckpointError(f"{file}: field {name!r} is missing or not a "
                                  f"{'finite number' if kind is float else kind.__name__}, got {_short(value)}")
    for name in ("observation_shape", "action_shape"):
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in metadata[name]):
            raise CheckpointError(f"{file}: field {name!r} must be a list of non-negative ints, got {_short(metadata[name])}")
    for name in ("capacity", "num_rows", "frame_stack", "max_priority"):
        if not metadata[name] > 0:
            raise CheckpointError(f"{file}: field {name!r} must be > 0, got {metadata[name]}")
    if "layout" not in metadata or not (metadata["layout"] is None or isinstance(metadata["layout"], dict)):
        raise CheckpointError(f"{file}: field 'layout' must be null or a layout object")
    leaf = metadata.get("frame_stack_leaf", 0)
    if not (leaf is None or isinstance(leaf, str)):
        raise CheckpointError(f"{file}: field 'frame_stack_leaf' must be null or a leaf name, got {_short(leaf)}")
    return metadata


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _dtype(metadata: dict, name: str, path: Path) -> np.dtype:
    """A plain numeric dtype from its ``dtype.str`` (e.g. '|u1', '<f4'); nothing else."""
    text = metadata[name]
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError):
        dtype = None
    if dtype is None or dtype.kind not in "biuf" or dtype.str != text or dtype.itemsize not in SAFETENSORS_DTYPES[dtype.kind]:
        raise CheckpointError(f"{path / METADATA}: field {name!r} must be a numeric dtype string such as '<f4', got {text!r}")
    return dtype


def _bit_generator(state: dict, path: Path) -> np.random.BitGenerator:
    name = state.get("bit_generator")
    if not isinstance(name, str) or name not in BIT_GENERATORS:
        raise CheckpointError(f"{path / METADATA}: field 'rng' names bit generator {_short(name)}; "
                              f"one of {sorted(BIT_GENERATORS)} expected")
    generator = BIT_GENERATORS[name]()
    try:
        generator.state = state
    except (ValueError, TypeError, KeyError, OverflowError, AttributeError) as err:
        raise CheckpointError(f"{path / METADATA}: field 'rng' is not a {name} state ({_first_line(err)})") from None
    return generator
