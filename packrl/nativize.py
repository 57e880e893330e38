"""nativize: packed uint8 rows -> the space's nested structure of zero-copy typed views.

Works on numpy arrays and on torch tensors on any device, and traces under
``torch.compile(fullgraph=True)``: every step is a slice, a dtype view (a bitcast) and a
reshape, read from the Layout's constant offsets (a bool leaf, under compile, a ``!= 0`` of its bytes).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packrl.emulation.layout import Layout, Leaf
from packrl.emulation.packer import WIDER_ROWS_HINT
from packrl.errors import NativizeError


def nativize(x: Any, layout: Layout) -> Any:
    """Views of rows ``x`` (``(..., nbytes)`` uint8) in ``layout``'s structure, leaf dtypes exact.

    Scalar leaves come back shaped ``(*batch,)``. A non-uint8 tensor is refused: packed bytes
    that went through ``torch.Tensor(obs)`` (a float32 cast) no longer hold the leaves.

    The layout of a plain Box also takes the Box's own rows (what ``emulate`` passes through for
    a Box observation: its dtype, shape ``(..., *box.shape)``) and returns them as they are."""
    if layout.box is not None and _is_box_rows(x, layout.box) and not _packed_shape(x, layout):
        return x  # uint8 rows of nbytes stay packed rows: for a uint8 Box the readings differ only when it is 0-d
    if isinstance(x, np.ndarray):
        _check(x.dtype == np.uint8, x.dtype, tuple(x.shape), layout)
        return layout.unpack(x)
    if not isinstance(x, torch.Tensor):
        raise NativizeError(f"nativize takes a numpy array or a torch tensor, got {type(x).__name__}")
    return layout.unflatten(leaf_views(x, layout))


def leaf_views(x: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """One zero-copy view of uint8 rows ``x`` per entry of ``layout.leaves`` (``(*batch, *leaf.shape)``,
    the leaf's exact dtype): what ``nativize`` puts into the layout's structure."""
    _check(x.dtype == torch.uint8, x.dtype, tuple(x.shape), layout)
    batch = tuple(x.shape[:-1])
    try:
        return [leaf_view(x, batch, start, end, TORCH_DTYPES[name], shape) for start, end, name, shape in layout.spans]
    except RuntimeError as err:  # torch views a dtype only at an offset aligned to it (numpy reads any offset)
        raise NativizeError(
            f"nativize cannot view these rows as the layout's leaves: torch needs every row to start at a byte "
            f"offset that is a multiple of {layout.alignment} (the layout's widest alignment), got storage offset "
            f"{x.storage_offset()} and strides {tuple(x.stride())} ({err}); pass an aligned tensor, e.g. "
            "x.contiguous() of rows cut from a wider buffer, or x.clone()") from None


def leaf_view(x: torch.Tensor, batch: tuple, start: int, end: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """Bytes ``[start, end)`` of rows ``x`` ``(*batch, nbytes)`` as ``(*batch, *shape)`` of ``dtype``, zero-copy."""
    if start == end:  # a leaf with no elements: no bytes to view, and strides of empty slices are arbitrary
        return torch.empty(batch + shape, dtype=dtype, device=x.device)
    part = x[..., start:end]
    if dtype == torch.bool and torch.compiler.is_compiling():
        # Inductor (torch 2.11, CPU and CUDA) fails to lower a uint8 -> bool bitcast; a packed bool byte is
        # 0 or 1, so the comparison reads the same values (a copy that Inductor fuses into its consumer)
        return (part != 0).view(batch + shape)
    if dtype != part.dtype:
        part = part.view(dtype)
    # no view of what is already in shape (each is an op to dispatch: encoders read leaves on every rollout step)
    return part if tuple(part.shape) == batch + shape else part.view(batch + shape)


def check_rows(x: torch.Tensor, layout: Layout) -> None:
    """Refuse (``NativizeError``) a tensor that is not uint8 rows of ``layout.nbytes`` bytes; no torch op."""
    _check(x.dtype == torch.uint8, x.dtype, tuple(x.shape), layout)


def _packed_shape(x: Any, layout: Layout) -> bool:
    uint8 = x.dtype == (np.uint8 if isinstance(x, np.ndarray) else torch.uint8)
    return uint8 and x.ndim >= 1 and x.shape[-1] == layout.nbytes


def _is_box_rows(x: Any, box: Leaf) -> bool:
    if isinstance(x, np.ndarray):
        same_dtype = x.dtype == box.dtype
    elif isinstance(x, torch.Tensor):
        same_dtype = x.dtype == TORCH_DTYPES[box.dtype.name]
    else:
        return False
    return same_dtype and x.ndim >= len(box.shape) and tuple(x.shape[x.ndim - len(box.shape):]) == box.shape


def _check(is_uint8: bool, dtype: Any, shape: tuple, layout: Layout) -> None:
    if not is_uint8:
        box = layout.box
        also = "" if box is None else f" (or this Box's own rows: dtype {box.dtype}, shape (..., {', '.join(map(str, box.shape))}))"
        raise NativizeError(
            f"nativize needs uint8 rows{also}, got dtype {dtype} and shape {shape}. Packed rows must stay bytes: "
            "torch.Tensor(obs) casts to float32 and destroys them; use torch.from_numpy(obs) or torch.as_tensor(obs)")
    if len(shape) < 1 or shape[-1] != layout.nbytes:
        raise NativizeError(f"nativize needs rows of {layout.nbytes} bytes (the layout's nbytes), got shape {shape}"
                            f"{WIDER_ROWS_HINT if len(shape) and shape[-1] > layout.nbytes else ''}")


TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
                 "uint16", "uint32", "uint64")
}


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (uint16/32/64 included, torch >= 2.3)."""
    return TORCH_DTYPES[np.dtype(dtype).name]
