"""nativize: packed uint8 rows -> the space's nested structure of zero-copy typed views.

Works on numpy arrays and on torch tensors on any device, and traces under
``torch.compile(fullgraph=True)``: every step is a slice, a dtype view (a bitcast) and a
reshape, read from the Layout's constant offsets.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packrl.emulation.layout import Layout
from packrl.errors import NativizeError


def nativize(x: Any, layout: Layout) -> Any:
    """Views of rows ``x`` (``(..., nbytes)`` uint8) in ``layout``'s structure, leaf dtypes exact.

    Scalar leaves come back shaped ``(*batch,)``. A non-uint8 tensor is refused: packed bytes
    that went through ``torch.Tensor(obs)`` (a float32 cast) no longer hold the leaves."""
    if isinstance(x, np.ndarray):
        _check(x.dtype == np.uint8, x.dtype, tuple(x.shape), layout)
        return layout.unpack(x)
    if not isinstance(x, torch.Tensor):
        raise NativizeError(f"nativize takes a numpy array or a torch tensor, got {type(x).__name__}")
    _check(x.dtype == torch.uint8, x.dtype, tuple(x.shape), layout)
    batch = tuple(x.shape[:-1])
    views = [_leaf_view(x, batch, start, end, TORCH_DTYPES[name], shape) for start, end, name, shape in layout.spans]
    return layout.unflatten(views)


def _leaf_view(x: torch.Tensor, batch: tuple, start: int, end: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    if start == end:  # a leaf with no elements: no bytes to view, and strides of empty slices are arbitrary
        return torch.empty(batch + shape, dtype=dtype, device=x.device)
    return x[..., start:end].view(dtype).view(batch + shape)


def _check(is_uint8: bool, dtype: Any, shape: tuple, layout: Layout) -> None:
    if not is_uint8:
        raise NativizeError(
            f"nativize needs uint8 rows, got dtype {dtype}. Packed rows must stay bytes: "
            "torch.Tensor(obs) casts to float32 and destroys them; use torch.from_numpy(obs) or torch.as_tensor(obs)")
    if len(shape) < 1 or shape[-1] != layout.nbytes:
        raise NativizeError(f"nativize needs rows of {layout.nbytes} bytes (the layout's nbytes), got shape {shape}")


TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
                 "uint16", "uint32", "uint64")
}


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (uint16/32/64 included, torch >= 2.3)."""
    return TORCH_DTYPES[np.dtype(dtype).name]
