"""Exact value conversion: turn a sample's leaf into an array of the leaf's dtype, or refuse.

Nothing is cast with loss. A value is accepted in another dtype only when every element
survives the conversion unchanged (2.0 into int64 yes, 2.5 no; 255 into uint8 yes, 300 no;
1e300 into float32 no). The one documented exception is float narrowing under
``round_floats=True`` (float64 0.1 into float32), which layouts refuse by default.
"""
from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from packrl.errors import EmulationError


@numba.njit(cache=True, nogil=True)
def _any_outside(arr: np.ndarray, low: int | np.uint64, high: int | np.uint64) -> bool:
    bad = False
    for x in arr.flat:  # any shape and memory layout: no reshape (a NumPy call) before the kernel
        bad |= (x < low) | (x > high)
    return bad


class Bounds:
    """Inclusive per-element bounds of one leaf (``codec.bounds``): packrl's one answer to "is this
    value inside its space". ``low`` and ``high`` have the leaf's shape and dtype: integers clipped
    to the dtype and exact (int64 and uint64 extremes included), bools as their bytes (uint8),
    floats with ``inf`` where unbounded. NaN is outside; ``needed``: some value of the dtype is."""

    def __init__(self, low: Any, high: Any, dtype: np.dtype, shape: tuple):
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        self.integer = self.dtype.kind in "iu"
        if self.integer:
            info = np.iinfo(self.dtype)
            low = np.broadcast_to(np.asarray(low, dtype=object), shape)
            high = np.broadcast_to(np.asarray(high, dtype=object), shape)
            self.low = np.array([max(int(x), info.min) for x in low.reshape(-1)], dtype=self.dtype).reshape(shape)
            self.high = np.array([min(int(x), info.max) for x in high.reshape(-1)], dtype=self.dtype).reshape(shape)
            self.needed = bool(self.low.size) and bool(np.any(self.low > info.min) or np.any(self.high < info.max))
        else:
            self.low = np.broadcast_to(np.asarray(low, dtype=self.dtype), shape).copy()
            self.high = np.broadcast_to(np.asarray(high, dtype=self.dtype), shape).copy()
            self.needed = True
        flat_low, flat_high = self.low.reshape(-1), self.high.reshape(-1)
        uniform = self.low.size and np.all(flat_low == flat_low[0]) and np.all(flat_high == flat_high[0])
        self.uniform = (flat_low[0], flat_high[0]) if uniform else None
        # the kernel's bounds as Python ints (NumPy scalars cost Numba's dispatcher a typeof each), but uint64's
        # as uint64: Numba compares uint64 with int64 through float64, where 2**63 - 1 and 2**63 are one value
        self._kernel_bounds = None
        if uniform and self.integer:
            self._kernel_bounds = self.uniform if self.dtype == np.uint64 else tuple(map(int, self.uniform))

    def mask(self, arr: np.ndarray) -> np.ndarray:
        """Elementwise: True where ``arr`` (shape ``(*batch, *shape)``) is outside (or NaN)."""
        return outside_bounds(arr, self.low, self.high)

    def outside(self, arr: np.ndarray) -> bool:
        """True when some element of ``arr`` (shape ``(*batch, *shape)``) is outside."""
        if not self.needed or not arr.size:
            return False
        if self._kernel_bounds is not None and arr.dtype == self.dtype:
            # one compiled pass: far cheaper than numpy's min and max reductions on small arrays
            return _any_outside(arr, *self._kernel_bounds)
        return bool(self.mask(arr).any())

    def refuse(self, arr: np.ndarray, path: tuple, why: str) -> None:
        """Raise EmulationError naming the first element outside, if any."""
        if self.outside(arr):
            refuse_outside(self.mask(arr), arr, path, why)


def outside_bounds(arr: Any, low: Any, high: Any) -> np.ndarray:
    """Elementwise: True where ``arr`` is outside ``[low, high]`` or NaN (packrl's one bounds test)."""
    with np.errstate(invalid="ignore"):
        return ~((arr >= low) & (arr <= high))


def format_path(path: tuple) -> str:
    """``('agent', 0)`` -> ``"['agent'][0]"``; the root is ``"<root>"``."""
    return "".join(f"[{k!r}]" for k in path) if path else "<root>"


def as_numeric_array(value: Any, path: tuple) -> np.ndarray:
    """``np.asarray`` that refuses strings, objects and complex numbers."""
    if type(value) is np.ndarray:
        arr = value
    else:
        try:
            arr = np.asarray(value)
        except (OverflowError, ValueError, TypeError) as err:
            raise EmulationError(f"leaf {format_path(path)}: cannot read {value!r} as a number array ({err})") from None
    if arr.dtype.kind not in "biuf":
        raise EmulationError(
            f"leaf {format_path(path)}: got {short(value)} of dtype {arr.dtype}, expected numbers"
        )
    return arr


def exact_array(value: Any, dtype: np.dtype, shape: tuple, path: tuple, round_floats: bool = False) -> np.ndarray:
    """Return ``value`` as an array of ``dtype`` and ``shape``, refusing any lossy conversion."""
    if type(value) is not np.ndarray and np.dtype(dtype).kind in "iu" and isinstance(value, (list, tuple)):
        arr = python_ints(value, np.dtype(dtype), shape, path)
        if arr is not None:
            return arr
    arr = as_numeric_array(value, path)
    if arr.shape != shape:
        raise EmulationError(f"leaf {format_path(path)}: shape {arr.shape} does not match the space's {shape}")
    if arr.dtype == dtype:
        return arr
    return convert_exactly(arr, dtype, path, round_floats)


def python_ints(value: list | tuple, dtype: np.dtype, shape: tuple, path: tuple) -> np.ndarray | None:
    """A nested list of numbers for an integer leaf, converted element by element when NumPy
    would read it as float64 (an int beyond int64 beside a smaller one, or floats): through float64,
    2**63 + 1 would become 2**63. None when NumPy reads it exactly (the common case)."""
    try:
        arr = np.asarray(value)
    except (OverflowError, ValueError, TypeError):
        arr = None
    if arr is None or arr.dtype.kind in "biu":
        return None  # read exactly, or not at all (the caller's check says why)
    objs = arr if arr.dtype == object else np.asarray(value, dtype=object)
    if objs.shape != shape:
        return None
    info = np.iinfo(dtype)
    out = np.empty(shape, dtype)
    for idx, x in np.ndenumerate(objs):
        if isinstance(x, (bool, int, np.bool_, np.integer)):
            v = int(x)
        elif isinstance(x, (float, np.floating)) and math.isfinite(x) and float(x).is_integer():
            v = int(x)
        else:
            raise EmulationError(f"leaf {format_path(path)}: value {x!r} at index {idx} is not an integer; "
                                 f"the leaf's dtype is {dtype} and packrl never casts with loss")
        if not info.min <= v <= info.max:
            raise EmulationError(f"leaf {format_path(path)}: value {x!r} at index {idx} does not fit {dtype} "
                                 f"[{info.min}, {info.max}]")
        out[idx] = v
    return out


def convert_exactly(arr: np.ndarray, dtype: np.dtype, path: tuple, round_floats: bool = False) -> np.ndarray:
    """Convert ``arr`` to ``dtype`` when no element changes; raise EmulationError naming the first that would."""
    src, dst = arr.dtype, np.dtype(dtype)
    if arr.size == 0:
        return arr.astype(dst)
    if dst.kind == "b":
        bad = ~((arr == 0) | (arr == 1))
        _refuse_if(bad, arr, dst, path, "is not 0 or 1")
        return arr.astype(dst)
    if dst.kind in "iu":
        if src.kind == "f":
            bad = ~np.isfinite(arr)
            _refuse_if(bad, arr, dst, path, "is not finite")
            _refuse_if(arr != np.trunc(arr), arr, dst, path, "is not an integer")
        info = np.iinfo(dst)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            bad = _outside_int_range(arr, info.min, info.max)
            _refuse_if(bad, arr, dst, path, f"does not fit {dst} [{info.min}, {info.max}]")
        return arr.astype(dst)
    if dst.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            cast = arr.astype(dst)
        if src.kind in "biu":
            _refuse_if(_int_to_float_changes(arr, cast), arr, dst, path, f"is not exactly representable in {dst}")
            return cast
        if src.itemsize <= dst.itemsize:
            return cast  # float widening is exact, NaN payloads included
        overflow = np.isinf(cast) & np.isfinite(arr)
        _refuse_if(overflow, arr, dst, path, f"overflows {dst}")
        if not round_floats:
            back, nan = cast.astype(src), np.isnan(arr)
            with np.errstate(invalid="ignore"):
                changed = (back != arr) & ~nan
            _refuse_if(changed, arr, dst, path, f"would be rounded to {dst} (pass round_floats=True to allow)")
            if nan.any():  # a NaN's payload bits must survive too
                bits = np.dtype(f"u{src.itemsize}")
                lost = nan & (back.view(bits) != arr.view(bits))
                _refuse_if(lost, arr, dst, path, f"is a NaN whose payload {dst} cannot hold (pass round_floats=True to allow)")
        return cast
    raise EmulationError(f"leaf {format_path(path)}: unsupported target dtype {dst}")


def _outside_int_range(arr: np.ndarray, lo: int, hi: int) -> np.ndarray:
    if arr.dtype.kind == "f":
        return (arr < float(lo)) | (arr > float(hi)) | (arr.astype(object) < lo) | (arr.astype(object) > hi)
    objs = arr.astype(object)
    return (objs < lo) | (objs > hi)


def _int_to_float_changes(arr: np.ndarray, cast: np.ndarray) -> np.ndarray:
    exact_limit = 2 ** (np.finfo(cast.dtype).nmant + 1)
    objs = arr.astype(object)
    big = (objs > exact_limit) | (objs < -exact_limit)
    if not big.any():
        return big.astype(bool)
    changed = np.zeros(arr.shape, dtype=bool)
    for idx in np.argwhere(big):  # argwhere: also a 0-d array's one index (np.nonzero refuses 0-d arrays)
        idx = tuple(idx)
        c = cast[idx]
        changed[idx] = (not np.isfinite(c)) or int(c) != int(arr[idx])
    return changed


def _refuse_if(bad: np.ndarray, arr: np.ndarray, dst: np.dtype, path: tuple, why: str) -> None:
    refuse_outside(bad, arr, path, f"(dtype {arr.dtype}) {why}; the leaf's dtype is {dst} and packrl never casts with loss")


def refuse_outside(bad: np.ndarray, arr: np.ndarray, path: tuple, why: str) -> None:
    """Raise EmulationError naming the first element where ``bad`` is true."""
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(np.asarray(bad))[0]) if arr.ndim else ()
        value = arr[idx] if idx else arr[()]
        where = f" at index {idx}" if idx else ""
        raise EmulationError(f"leaf {format_path(path)}: value {value!r}{where} {why}")


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` (an exception's message), cut to ``limit`` characters."""
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
