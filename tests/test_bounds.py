"""Bounds.outside, packrl's one "is this inside its space" test, against Python's exact integers: every integer
dtype, uniform bounds anywhere in the dtype (its extremes included), arrays of any shape and memory layout."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from packrl.emulation.values import Bounds

INTEGER_DTYPES = [np.dtype(t) for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")]


@st.composite
def bounded_arrays(draw):
    dtype = draw(st.sampled_from(INTEGER_DTYPES))
    info = np.iinfo(dtype)
    # values near the extremes and near each other: where a comparison through float64 would go wrong
    near = st.sampled_from([info.min, info.min + 1, info.max - 1, info.max, 0, 2**53, 2**53 + 1, 2**63 - 1])
    value = st.one_of(near.filter(lambda v: info.min <= v <= info.max), st.integers(info.min, info.max))
    low, high = sorted((draw(value), draw(value)))
    arr = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), elements=value))
    if arr.ndim >= 2 and draw(st.booleans()):
        arr = arr.swapaxes(0, 1)  # not C-contiguous
    return arr, low, high


@settings(max_examples=300, deadline=None)
@given(bounded_arrays())
def test_outside_is_exact_for_every_integer_dtype(case):
    arr, low, high = case
    bounds = Bounds(low, high, arr.dtype, ())
    expected = any(not low <= int(x) <= high for x in arr.reshape(-1).tolist())
    assert bool(bounds.outside(arr)) == expected
    assert bool(bounds.mask(arr).any()) == expected
