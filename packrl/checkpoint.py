"""Checkpoints: weights in safetensors (no pickle) and metadata in JSON, in one folder.

    run/checkpoint/
      model.safetensors   policy weights, plus ``optimizer/...`` tensors when saved for resuming
      metadata.json       architecture config, layouts, env id, package versions, seed, step, and the
                          SHA-256 of model.safetensors

``read_metadata`` needs only the standard library (no torch import), so a checkpoint can be inspected
anywhere; ``load_checkpoint`` checks the SHA-256 before it parses a single weight.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import time
from pathlib import Path
from typing import Any

from packrl.errors import PackrlError

FORMAT = "packrl.checkpoint/1"
WEIGHTS, METADATA = "model.safetensors", "metadata.json"
PACKAGES = ("packrl", "torch", "numpy", "gymnasium", "pettingzoo", "numba", "safetensors")


class CheckpointError(PackrlError, ValueError):
    """A checkpoint is missing, malformed, or its weights do not match the recorded SHA-256."""


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


def save_checkpoint(path: str | Path, state_dict: dict, *, config: dict, layouts: dict[str, Any] | None = None,
                    env_id: str | None = None, seed: int | None = None, optimizer: dict | None = None,
                    **extra: Any) -> Path:
    """Write weights and metadata into the folder ``path``. ``config`` is the architecture (enough to rebuild
    the policy), ``layouts`` maps names to ``Layout`` objects or their JSON, ``optimizer`` an optimizer's
    state_dict (its tensors go into the safetensors file, the rest into the metadata). ``extra``: any
    JSON-serializable facts (global step, hyperparameters)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in state_dict.items()}
    optimizer_meta = None
    if optimizer is not None:
        optimizer_tensors, optimizer_meta = _split_optimizer(optimizer)
        tensors.update(optimizer_tensors)
    weights = path / WEIGHTS
    tmp = weights.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(weights)  # a crash mid-write never leaves a half file under the real name
    metadata = {
        "format": FORMAT,
        "sha256": sha256_file(weights),
        "config": config,
        "layouts": {k: v if isinstance(v, (str, dict)) else json.loads(v.to_json()) for k, v in (layouts or {}).items()},
        "env_id": env_id,
        "seed": seed,
        "packages": package_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "optimizer": optimizer_meta,
        **extra,
    }
    (path / METADATA).write_text(json.dumps(metadata, indent=2, default=_jsonable))
    return path


def read_metadata(path: str | Path) -> dict:
    """The metadata only; imports neither torch nor safetensors."""
    file = Path(path) / METADATA
    if not file.is_file():
        raise CheckpointError(f"{path}: no {METADATA} (is this a packrl checkpoint folder?)")
    try:
        metadata = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file}: not valid JSON ({err})") from None
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{file}: format {metadata.get('format')!r}, expected {FORMAT!r}")
    return metadata


def verify(path: str | Path) -> dict:
    """Check the weights' SHA-256 against the metadata; returns the metadata."""
    metadata = read_metadata(path)
    weights = Path(path) / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{path}: {WEIGHTS} is missing")
    actual = sha256_file(weights)
    if actual != metadata.get("sha256"):
        raise CheckpointError(f"{weights}: SHA-256 {actual} does not match the metadata's {metadata.get('sha256')}; "
                              "the file was changed or corrupted after it was saved")
    return metadata


def load_checkpoint(path: str | Path, device: Any = "cpu") -> tuple[dict, dict, dict | None]:
    """Verify, then load: ``(policy state_dict, metadata, optimizer state_dict or None)``."""
    metadata = verify(path)
    from safetensors.torch import load_file

    tensors = load_file(str(Path(path) / WEIGHTS), device=str(device))
    state = {k: v for k, v in tensors.items() if not k.startswith("optimizer/")}
    optimizer = None
    if metadata.get("optimizer") is not None:
        optimizer = _join_optimizer({k: v for k, v in tensors.items() if k.startswith("optimizer/")},
                                    metadata["optimizer"])
    return state, metadata, optimizer


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
        _, param, key = name.split("/", 2)
        state.setdefault(int(param), {})[key] = value
    for param, entries in meta.get("scalars", {}).items():
        state.setdefault(int(param), {}).update(entries)
    return {"state": state, "param_groups": meta["param_groups"]}


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays in metadata become plain JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"checkpoint metadata value {value!r} of type {type(value).__name__} is not JSON-serializable")
