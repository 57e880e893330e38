"""Checkpoints: weights in safetensors (no pickle) and metadata in JSON, in one folder. Data, never code.

    run/checkpoint/
      model.safetensors   policy weights, plus ``optimizer/<param>/<key>`` tensors when saved for resuming
      metadata.json       architecture config, layouts, env id, package versions, seed, step,
                          ``weights_sha256`` (of model.safetensors) and ``sha256``: the manifest hash

The manifest hash is the SHA-256 of the canonical JSON of the metadata without ``sha256`` itself; as the
metadata holds the weights' hash, it covers both files. Give the hash printed at save time to
``load_checkpoint(path, expected_sha256=...)`` (``packrl eval --sha256``) to refuse any edit to either file.

Everything before the tensors are parsed needs only the standard library: ``read_metadata``,
``read_header`` (the safetensors header: 8-byte little-endian length, then JSON) and ``verify``. Loading
checks, in order and before any tensor is allocated: the format, the manifest hash, the weights' hash, the
header (dtypes, shapes, offsets inside the file, tensor names), and the shapes the caller expects.

Saving is atomic: the files are written into a temporary sibling folder that is then renamed into place;
an existing checkpoint is first renamed to a backup, removed only after the new one is in place. An
interruption at any point leaves the previous checkpoint loadable (loading reads the backup while the swap
is unfinished; the next save completes or undoes it). Nothing is written through a symlink; reading follows
symlinks (model hubs' caches link their files).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from packrl.errors import PackrlError

FORMAT = "packrl.checkpoint/3"  # 3: the Layout encoder reads flat leaves together (its buffers changed)
OLD_FORMATS = ("packrl.checkpoint/1", "packrl.checkpoint/2")
WEIGHTS, METADATA = "model.safetensors", "metadata.json"
PACKAGES = ("packrl", "torch", "numpy", "gymnasium", "pettingzoo", "numba", "safetensors")

MAX_HEADER_BYTES = 100 << 20
"""A safetensors header larger than this is refused unread (the format's own limit is 100 MB)."""
MAX_METADATA_BYTES = 64 << 20
"""A metadata.json larger than this is refused unread."""
MAX_JSON_DEPTH = 256
"""JSON nested deeper than this (arrays and objects) is refused before it is parsed: the standard library's
parser recurses, and a file nested 100,000 deep would end in RecursionError. Layouts of spaces nested 60 deep
stay far below it."""
MAX_TENSORS = 1 << 16
"""A safetensors header with more entries than this is refused (a policy has hundreds)."""

DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
_TORCH_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
                 "I16": "int16", "U16": "uint16", "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32",
                 "F32": "float32", "I64": "int64", "U64": "uint64", "F64": "float64", "C64": "complex64"}
POLICY_NAME = re.compile(r"[A-Za-z0-9_.]+")
OPTIMIZER_NAME = re.compile(r"optimizer/(0|[1-9][0-9]{0,8})/([A-Za-z_][A-Za-z0-9_]*)")
_BACKUP, _TMP = ".{}.previous", ".{}.tmp-"


class CheckpointError(PackrlError, ValueError):
    """A checkpoint is missing, malformed, or does not match its recorded (or the expected) hash."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of a safetensors header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def json_depth(raw: bytes | str) -> int:
    """The nesting depth of arrays and objects in JSON text (strings skipped), without recursion. Runs in C
    but for the final count of the brackets, which are few in any real file."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")  # escaped backslashes, then escaped quotes
    brackets = _NOT_BRACKETS.sub(b"", _STRINGS.sub(b"", unescaped))
    depth = deepest = 0
    for byte in brackets:
        if byte in (91, 123):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


_STRINGS = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = re.compile(rb"[^\[\]{}]+")


def loads_bounded(raw: bytes | str, where: Any, what: str = "JSON", max_bytes: int = MAX_METADATA_BYTES,
                  max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(raw)`` after checking its size and nesting depth; CheckpointError naming ``where`` for
    text that is too large, too deep, not UTF-8 or not JSON (a number of more digits than Python converts too)."""
    if len(raw) > max_bytes:
        raise CheckpointError(f"{where}: {what} of {len(raw):,} bytes is larger than the {max_bytes:,} bytes packrl reads")
    depth = json_depth(raw)
    if depth > max_depth:
        raise CheckpointError(f"{where}: {what} nested {depth} deep; packrl reads at most {max_depth} levels")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{where}: not valid {what} ({_one_line(err)})") from None
    except (ValueError, RecursionError) as err:  # an integer of more digits than int() takes
        raise CheckpointError(f"{where}: {what} packrl cannot read ({_one_line(err)})") from None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 200 else text[:197] + "..."


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def manifest_sha256(metadata: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no spaces) of ``metadata`` without its ``sha256`` entry."""
    body = {k: v for k, v in metadata.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- saving


def save_checkpoint(path: str | Path, state_dict: dict, *, config: dict, layouts: dict[str, Any] | None = None,
                    env_id: str | None = None, seed: int | None = None, optimizer: dict | None = None,
                    **extra: Any) -> Path:
    """Write weights and metadata into the folder ``path``, atomically (see the module doc). ``config`` is the
    architecture (enough to rebuild the policy), ``layouts`` maps names to ``Layout`` objects or their JSON,
    ``optimizer`` an optimizer's state_dict (its tensors go into the safetensors file, the rest into the
    metadata). ``extra``: any JSON-serializable facts (global step, hyperparameters). The manifest hash is
    ``read_metadata(path)["sha256"]``."""
    from safetensors.torch import save

    path = Path(path)
    tensors = {name: t.detach().contiguous().cpu() for name, t in state_dict.items()}
    optimizer_meta = None
    if optimizer is not None:
        optimizer_tensors, optimizer_meta = _split_optimizer(optimizer)
        tensors.update(optimizer_tensors)
    for name in tensors:
        _check_name(name, path / WEIGHTS)  # never write a checkpoint that loading would refuse
    weights = save(tensors)
    metadata = {
        "format": FORMAT,
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
        "config": config,
        "layouts": {k: v if isinstance(v, (str, dict)) else json.loads(v.to_json()) for k, v in (layouts or {}).items()},
        "env_id": env_id,
        "seed": seed,
        "packages": package_versions(),  # no save time: same seed, same weights, same manifest hash
        "optimizer": optimizer_meta,
        **extra,
    }
    metadata = json.loads(json.dumps(metadata, default=_jsonable))  # the hash covers what the file will hold
    metadata["sha256"] = manifest_sha256(metadata)
    _write_folder(path, {WEIGHTS: weights, METADATA: json.dumps(metadata, indent=2).encode()})
    return path


def _write_folder(path: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into a fresh temporary sibling of ``path``, then rename it into place."""
    _refuse_symlinks(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _refuse_symlinks(path)
    _recover(path)
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(f"{path}: exists and is not a folder; refusing to replace it with a checkpoint")
        unknown = sorted(p.name for p in path.iterdir() if p.name not in (WEIGHTS, METADATA))
        if unknown:
            raise CheckpointError(f"{path}: holds files that are not part of a checkpoint ({', '.join(unknown[:5])}); "
                                  "refusing to replace the folder")
    tmp = path.parent / f"{_TMP.format(path.name)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name, data in files.items():
            fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        _fsync_dir(tmp)
        backup = path.parent / _BACKUP.format(path.name)
        if path.exists():
            os.replace(path, backup)  # from here until the next rename, the previous checkpoint is the backup
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if backup.exists():
            shutil.rmtree(backup)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _recover(path: Path) -> None:
    """Finish what an interrupted save left: restore the backup when the new folder never arrived, drop it
    when it did, and remove temporary folders of saves that are no longer running."""
    backup = path.parent / _BACKUP.format(path.name)
    if backup.is_dir() and not backup.is_symlink():
        if path.exists():
            shutil.rmtree(backup)
        else:
            os.replace(backup, path)
    if path.parent.is_dir():
        for tmp in path.parent.glob(_TMP.format(path.name) + "*"):
            pid = tmp.name[len(_TMP.format(path.name)):].split("-")[0]
            if tmp.is_dir() and not tmp.is_symlink() and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    # a temporary folder of this process is not in use once its save returned or raised
    return pid != os.getpid() and pid_exists(pid)


def pid_exists(pid: int) -> bool:
    """Whether the kernel knows process ``pid`` (signal 0: nothing is sent; another user's process exists too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _refuse_symlinks(path: Path) -> None:
    for p in (path, path.parent):
        if p.is_symlink():
            raise CheckpointError(f"{p}: is a symlink; a checkpoint is never written through a symlink")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; the renames are still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- reading (standard library only)


def checkpoint_folder(path: str | Path) -> Path:
    """The folder to read for ``path``: ``path`` itself, or the previous checkpoint's backup while a save that
    replaces it was interrupted mid-swap."""
    path = Path(path)
    backup = path.parent / _BACKUP.format(path.name)
    if not path.exists() and backup.is_dir():
        return backup
    return path


def read_metadata(path: str | Path) -> dict:
    """The metadata only, its format checked (not its hashes: see ``verify``); imports neither torch nor
    safetensors."""
    folder = checkpoint_folder(path)
    file = folder / METADATA
    if not file.is_file():
        raise CheckpointError(f"{path}: no {METADATA} (is this a packrl checkpoint folder?)")
    size = file.stat().st_size
    if size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{file}: {size:,} bytes, larger than the {MAX_METADATA_BYTES:,} bytes packrl reads "
                              "as checkpoint metadata")
    with open(file, "rb") as f:
        raw = f.read(MAX_METADATA_BYTES + 1)
    metadata = loads_bounded(raw, file)
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(metadata).__name__}")
    if metadata.get("format") != FORMAT:
        older = " (written by an older packrl, whose policy parameters differ: retrain, or load it with that version)" \
            if metadata.get("format") in OLD_FORMATS else ""
        raise CheckpointError(f"{file}: field 'format' is {_short(metadata.get('format'))}, expected {FORMAT!r}{older}")
    for key, kind in (("config", dict), ("layouts", dict), ("sha256", str), ("weights_sha256", str)):
        if not isinstance(metadata.get(key), kind):
            raise CheckpointError(f"{file}: field {key!r} is missing or not a {'JSON object' if kind is dict else 'string'}")
    return metadata


def read_header(data_or_path: bytes | str | Path, where: str | Path | None = None) -> tuple[dict[str, TensorInfo], dict]:
    """The tensors (name -> TensorInfo) and ``__metadata__`` of a safetensors file or its bytes, checked:
    known dtypes, non-negative integer shapes, byte ranges that match the shape and lie inside the file,
    and tensor names packrl writes. Reads only the header from a path."""
    if isinstance(data_or_path, (bytes, bytearray, memoryview)):
        data = memoryview(data_or_path)
        where = where or "weights"
        size = len(data)
        prefix = bytes(data[:8])
    else:
        where = where or data_or_path
        size = os.path.getsize(data_or_path)
        with open(data_or_path, "rb") as f:
            prefix = f.read(8)
    if size < 8:
        raise CheckpointError(f"{where}: not a safetensors file ({size} bytes)")
    (length,) = struct.unpack("<Q", prefix)
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise CheckpointError(f"{where}: not a safetensors file (header length {length} for a file of {size} bytes)")
    if isinstance(data_or_path, (bytes, bytearray, memoryview)):
        raw = bytes(data[8: 8 + length])
    else:
        with open(data_or_path, "rb") as f:
            f.seek(8)
            raw = f.read(length)
    header = loads_bounded(raw, where, "safetensors header JSON", max_bytes=MAX_HEADER_BYTES, max_depth=8)
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: not a safetensors file (its header is not a JSON object)")
    if len(header) > MAX_TENSORS + 1:
        raise CheckpointError(f"{where}: the safetensors header lists {len(header):,} tensors; packrl reads at most "
                              f"{MAX_TENSORS:,}")
    if not isinstance(header.get("__metadata__", {}), (dict, type(None))):
        raise CheckpointError(f"{where}: the safetensors header's __metadata__ is not a JSON object")
    extra = header.pop("__metadata__", None) or {}
    data_size = size - 8 - length
    tensors = {name: _tensor_info(name, entry, data_size, where) for name, entry in header.items()}
    return tensors, extra


def _tensor_info(name: str, entry: Any, data_size: int, where: Any) -> TensorInfo:
    _check_name(name, where)
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(f"{where}: tensor {name!r}: a header entry needs exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise CheckpointError(f"{where}: tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_size):
        raise CheckpointError(f"{where}: tensor {name!r}: data_offsets {offsets!r} outside the {data_size} data bytes")
    if math.prod(shape) * DTYPE_SIZES[dtype] != offsets[1] - offsets[0]:
        raise CheckpointError(f"{where}: tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} of {dtype}")
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])


def _check_name(name: str, where: Any) -> None:
    if name.startswith("optimizer/"):
        if not OPTIMIZER_NAME.fullmatch(name):
            raise CheckpointError(f"{where}: tensor name {name!r} is not optimizer/<parameter index>/<identifier>")
    elif not POLICY_NAME.fullmatch(name):
        raise CheckpointError(f"{where}: tensor name {name!r} has characters other than letters, digits, '_' and '.'")


@dataclass(frozen=True)
class Verified:
    """A checkpoint whose hashes and header checked out: its metadata, its weights' header and the very bytes
    that were hashed (the loader builds from these, so nothing is read or hashed twice)."""

    folder: Path
    metadata: dict
    tensors: dict[str, TensorInfo]
    data: bytes

    @property
    def file(self) -> Path:
        """The metadata file (errors name it)."""
        return self.folder / METADATA

    @property
    def weights(self) -> Path:
        return self.folder / WEIGHTS


def verify(path: str | Path | Verified, expected_sha256: str | None = None) -> Verified:
    """Check the manifest hash (and ``expected_sha256`` when given), the weights' hash and header, in one read
    of the weights; returns what was verified (metadata and the hashed bytes). Standard library only. A
    ``Verified`` given again is only checked against ``expected_sha256``."""
    if isinstance(path, Verified):
        _check_expected(path.metadata["sha256"], expected_sha256, path.folder)
        return path
    folder = checkpoint_folder(path)
    metadata = read_metadata(path)
    file = folder / METADATA
    recorded = manifest_sha256(metadata)
    if recorded != metadata["sha256"]:
        raise CheckpointError(f"{file}: field 'sha256' {metadata['sha256']} does not match the manifest hash {recorded}; "
                              "the metadata or weights were changed after saving")
    _check_expected(recorded, expected_sha256, folder)
    weights = folder / WEIGHTS
    if not weights.is_file():  # a symlink to a file is read (model hubs' caches link their blobs); never written
        raise CheckpointError(f"{weights}: missing (or not a file)")
    data = weights.read_bytes()
    actual = hash_weights(data)
    if actual != metadata["weights_sha256"]:
        raise CheckpointError(f"{weights}: SHA-256 {actual} does not match the metadata's weights_sha256 "
                              f"{metadata['weights_sha256']}; the file was changed or corrupted after it was saved")
    tensors, _ = read_header(data, weights)
    _check_optimizer_meta(metadata.get("optimizer"), tensors, file)
    return Verified(folder, metadata, tensors, data)


def hash_weights(data: bytes) -> str:
    """The SHA-256 of a weights file's bytes: the one hash pass a command makes over them (tests count it)."""
    return hashlib.sha256(data).hexdigest()


def _check_expected(recorded: str, expected_sha256: str | None, folder: Path) -> None:
    if expected_sha256 is not None and expected_sha256.strip().lower() != recorded:
        raise CheckpointError(f"{folder}: manifest SHA-256 {recorded} does not match the expected {expected_sha256}")


def _check_optimizer_meta(meta: Any, tensors: dict[str, TensorInfo], file: Path) -> None:
    has_tensors = any(name.startswith("optimizer/") for name in tensors)
    if meta is None:
        if has_tensors:
            raise CheckpointError(f"{file}: field 'optimizer' is null but the weights hold optimizer tensors")
        return
    groups = meta.get("param_groups") if isinstance(meta, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                               and all(type(p) is int for p in g["params"]) for g in groups):
        raise CheckpointError(f"{file}: field 'optimizer.param_groups' must be a list of objects with integer 'params'")
    scalars = meta.get("scalars", {})
    if not isinstance(scalars, dict) or not all(k.isdigit() and isinstance(v, dict) for k, v in scalars.items()):
        raise CheckpointError(f"{file}: field 'optimizer.scalars' must map parameter indices to objects")


# ---------------------------------------------------------------- loading


def load_checkpoint(path: str | Path | Verified, device: Any = "cpu", *, expected_sha256: str | None = None,
                    expected: Mapping[str, tuple[str, tuple[int, ...]]] | None = None) -> tuple[dict, dict, dict | None]:
    """Verify (unless ``path`` is already a ``Verified``), then load: ``(policy state_dict, metadata, optimizer
    state_dict or None)``.

    ``expected`` (name -> (safetensors dtype, shape), see ``tensor_specs``) is compared with the header before
    any tensor is allocated: a missing, extra or differently shaped policy tensor is refused by name."""
    verified = verify(path, expected_sha256)
    metadata, weights = verified.metadata, verified.weights
    if expected is not None:
        compare_specs(verified.tensors, expected, weights)
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        loaded = load(verified.data)
    except (SafetensorError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{weights}: unreadable safetensors data ({err})") from None
    loaded = {k: v.to(device) for k, v in loaded.items()}
    state = {k: v for k, v in loaded.items() if not k.startswith("optimizer/")}
    optimizer = None
    if metadata.get("optimizer") is not None:
        optimizer = _join_optimizer({k: v for k, v in loaded.items() if k.startswith("optimizer/")}, metadata["optimizer"])
    return state, metadata, optimizer


def compare_specs(tensors: Mapping[str, TensorInfo], expected: Mapping[str, tuple[str, tuple[int, ...]]],
                  where: Any) -> None:
    """Refuse, naming the first tensor, a header whose policy tensors differ from ``expected``."""
    have = {name: info for name, info in tensors.items() if not name.startswith("optimizer/")}
    missing = [name for name in expected if name not in have]
    if missing:
        raise CheckpointError(f"{where}: tensor {missing[0]!r} that the policy needs is missing"
                              + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    unexpected = [name for name in have if name not in expected]
    if unexpected:
        raise CheckpointError(f"{where}: tensor {unexpected[0]!r} is not part of the policy")
    for name, (dtype, shape) in expected.items():
        info = have[name]
        if (info.dtype, info.shape) != (dtype, tuple(shape)):
            raise CheckpointError(f"{where}: tensor {name!r} is {info.dtype} {list(info.shape)}, the policy built from "
                                  f"the metadata's config needs {dtype} {list(shape)}")


def compare_layout(recorded: Any, actual: Mapping[str, Any], name: str, where: Any) -> None:
    """Refuse a recorded layout (its JSON) that differs from the env's (``Layout.to_dict()``), naming the first
    differing leaf and what differs. Compares JSON only: nothing recorded is rebuilt or allocated."""
    field = f"layouts.{name}"
    if not isinstance(recorded, dict) or not isinstance(recorded.get("leaves"), list):
        raise CheckpointError(f"{where}: field {field!r} is missing or not a layout (the env's {name} layout "
                              "cannot be checked against it)")
    have, want = recorded["leaves"], list(actual["leaves"])
    for r, a in zip(have, want):
        if r != a:
            keys = [k for k in a if not isinstance(r, dict) or r.get(k) != a[k]] or ["entry"]
            got = {k: r.get(k) for k in keys} if isinstance(r, dict) else r
            raise CheckpointError(f"{where}: {field} differs from the env's at leaf {leaf_name(a['path'])}: "
                                  + "; ".join(f"{k} {_short(got.get(k) if isinstance(got, dict) else got)} in the "
                                              f"checkpoint, {_short(a.get(k))} in the env" for k in keys))
    if len(have) != len(want):
        first = want[len(have)] if len(want) > len(have) else have[len(want)]
        side = "env" if len(want) > len(have) else "checkpoint"
        path = first.get("path", []) if isinstance(first, dict) else []
        raise CheckpointError(f"{where}: {field} has {len(have)} leaves, the env's {len(want)}; the first one only the "
                              f"{side} has is {leaf_name(path)}")
    specs = _tree_specs(recorded.get("tree"), (), where, field)
    for (path, r), (_, a) in zip(specs, _tree_specs(actual["tree"], (), where, field)):
        if r != a:
            keys = [k for k in sorted(set(r) | set(a), key=str) if r.get(k) != a.get(k)]
            raise CheckpointError(f"{where}: {field} differs from the env's at leaf {leaf_name(path)}: "
                                  + "; ".join(f"{k} {_short(r.get(k))} in the checkpoint, {_short(a.get(k))} in the env"
                                              for k in keys))
    if recorded != dict(actual):
        keys = [k for k in sorted(set(recorded) | set(actual)) if recorded.get(k) != actual.get(k)]
        raise CheckpointError(f"{where}: {field} differs from the env's in {keys}")


def _tree_specs(tree: Any, path: tuple, where: Any, field: str) -> list[tuple[tuple, dict]]:
    """(path, leaf spec) of every leaf of a layout tree (its JSON), in order."""
    if isinstance(tree, dict) and len(tree) == 1:
        (kind, value), = tree.items()
        if kind == "leaf" and isinstance(value, dict):
            return [(path, value)]
        if kind == "dict" and isinstance(value, list) and all(isinstance(e, list) and len(e) == 2 for e in value):
            return [x for key, child in value for x in _tree_specs(child, path + (key,), where, field)]
        if kind == "tuple" and isinstance(value, list):
            return [x for i, child in enumerate(value) for x in _tree_specs(child, path + ({"int": i},), where, field)]
    raise CheckpointError(f"{where}: field '{field}.tree' is malformed at {leaf_name(list(path))}")


def leaf_name(path: Any) -> str:
    """A recorded leaf path (``[{"str": "a"}, {"int": 0}]``) written as packrl writes paths (``['a'][0]``)."""
    if not isinstance(path, list) or not path:
        return "(root)"
    parts = []
    for key in path:
        value = next(iter(key.values())) if isinstance(key, dict) and len(key) == 1 else key
        parts.append(f"[{value!r}]")
    return "".join(parts)


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tensor_specs(state_dict: Mapping[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype, shape) of a torch state_dict, for ``load_checkpoint(expected=...)``."""
    import torch

    names = {getattr(torch, attr): name for name, attr in _TORCH_DTYPES.items() if hasattr(torch, attr)}
    return {k: (names[v.dtype], tuple(v.shape)) for k, v in state_dict.items()}


def _split_optimizer(state_dict: dict) -> tuple[dict, dict]:
    """torch optimizer state -> (flat tensors, JSON rest). Tensors are named optimizer/<param>/<key>."""
    import torch

    tensors, scalars = {}, {}
    for param, entries in state_dict["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{param}/{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(param), {})[key] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _join_optimizer(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for name, value in tensors.items():
        _, param, key = name.split("/", 2)  # names were checked against OPTIMIZER_NAME
        state.setdefault(int(param), {})[key] = value
    for param, entries in meta.get("scalars", {}).items():
        state.setdefault(int(param), {}).update(entries)
    return {"state": dict(sorted(state.items())), "param_groups": meta["param_groups"]}  # the optimizer's own order


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays in metadata become plain JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"checkpoint metadata value {value!r} of type {type(value).__name__} is not JSON-serializable")
