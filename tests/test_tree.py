"""The one tree walk (``packrl.emulation.tree``), the one bounds source (``codec.bounds``) and the
pack surface around them: flatten/unflatten are inverses and name bad paths, bounds agree with
the spaces' own ``contains`` (int64/uint64 extremes included), a Dict key that reads like code
stays on the compiled path, and a layout's caches hold no reference cycle."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_engines import ENGINES, use_engine
from spaces_strategies import INT_DTYPES, discretes, int_boxes, multi_binaries, multi_discretes, nested_spaces
from spaces_strategies import sample as draw

from packrl import EmulationError
from packrl.emulation import Layout
from packrl.emulation.tree import flatten, iter_leaves, map_leaves, unflatten


def same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a is b


@settings(max_examples=60, deadline=None)
@given(nested_spaces, st.integers(0, 2**31))
def test_flatten_and_unflatten_are_inverses_in_leaf_order(space, seed):
    layout = Layout.from_space(space)
    sample = draw(space, np.random.default_rng(seed))
    values = flatten(layout.root, sample)
    assert same(unflatten(layout.root, values), sample)
    paths = [path for path, _ in iter_leaves(layout.root)]
    assert paths == list(dict.fromkeys(leaf.path for leaf in layout.leaves)), "leaf order is the layout's"
    assert same(map_leaves(lambda path, node: path, layout.root), unflatten(layout.root, paths))


def test_flatten_names_the_path_of_what_is_missing_extra_or_short():
    root = Layout.from_space(spaces.Dict({"a": spaces.Tuple((spaces.Discrete(2), spaces.Dict({"b": spaces.Discrete(2)})))})).root
    with pytest.raises(EmulationError, match=r"at \['a'\]\[1\]: missing keys \['a'\]\[1\]\['b'\]"):
        flatten(root, {"a": (0, {})})
    with pytest.raises(EmulationError, match=r"at \['a'\]\[1\]: .*unexpected keys \['a'\]\[1\]\['c'\]"):
        flatten(root, {"a": (0, {"b": 1, "c": 2})})
    with pytest.raises(EmulationError, match=r"at \['a'\]: expected a tuple of 2 items, got list of length 1"):
        flatten(root, {"a": [0]})
    with pytest.raises(EmulationError, match=r"at <root>: expected a dict with keys \['a'\], got int"):
        flatten(root, 3)


def _contains_each(space, arr) -> np.ndarray:
    """The space's own answer, element by element (the reference the bounds must agree with)."""
    if isinstance(space, spaces.Discrete):
        return np.array([space.contains(arr.dtype.type(x)) for x in arr.reshape(-1)])
    low, high = (np.broadcast_to(b, space.shape).reshape(-1) for b in (
        (space.low, space.high) if isinstance(space, spaces.Box) else
        (space.start, space.start + space.nvec - 1) if isinstance(space, spaces.MultiDiscrete) else (0, 1)))
    flat = arr.reshape(-1)
    return np.array([int(lo) <= int(x) <= int(hi) for x, lo, hi in zip(flat, low, high)])


@settings(max_examples=80, deadline=None)
@given(st.one_of(int_boxes(), discretes(), multi_discretes(), multi_binaries), st.integers(0, 2**31))
def test_bounds_agree_with_the_space_at_the_dtype_extremes(space, seed):
    rng = np.random.default_rng(seed)
    layout = Layout.from_space(space)
    (leaf,) = layout.leaves
    bounds = leaf.bounds
    info = np.iinfo(leaf.dtype)
    picks = np.array([info.min, info.max, 0, 1, -1 if info.min < 0 else 2], dtype=object)
    low, high = bounds.low.astype(object).reshape(-1), bounds.high.astype(object).reshape(-1)
    size = int(np.prod(leaf.shape, dtype=np.int64))
    values = [rng.choice(np.concatenate([picks, low - 1, low, high, high + 1])) for _ in range(size)]
    arr = np.array([min(max(int(v), info.min), info.max) for v in values], dtype=leaf.dtype).reshape(leaf.shape)
    inside = _contains_each(space, arr)
    assert (~bounds.mask(arr)).reshape(-1).tolist() == inside.tolist()
    assert bounds.outside(arr) == (not inside.all())
    if inside.all():
        assert layout.unpack(layout.pack(arr if leaf.shape else arr[()]))[()].tolist() == arr.tolist()
    else:
        with pytest.raises(EmulationError):
            layout.pack(arr if leaf.shape else arr[()])


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_bounds_of_full_range_boxes_are_not_needed_and_exact(dtype):
    info = np.iinfo(dtype)
    bounds = Layout.from_space(spaces.Box(info.min, info.max, (2,), dtype)).leaves[0].bounds
    assert not bounds.needed and bounds.low.dtype == dtype
    assert bounds.low.tolist() == [int(info.min)] * 2 and bounds.high.tolist() == [int(info.max)] * 2


@pytest.mark.parametrize("key", ["return False", "return i", "raise _Refused", "if x: return False"])
def test_a_dict_key_that_reads_like_code_stays_on_the_compiled_path(key):
    layout = Layout.from_space(spaces.Dict({key: spaces.Box(0, 9, (3,), np.int32), "n": spaces.Discrete(4)}))
    sample = {key: np.array([1, 2, 3], np.int32), "n": 2}
    compiled = layout.compiled_pack()
    rows = np.zeros((2, layout.nbytes), np.uint8)
    assert compiled.pack(sample, rows, 0) is True, "the compiled pack should take the sample itself"
    assert compiled.pack_many([sample, sample], rows, 0) == 2
    assert rows[0].tobytes() == layout.pack(sample).tobytes() == rows[1].tobytes()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_layout_with_a_bound_buffer_is_freed_without_the_cycle_collector(engine, monkeypatch):
    use_engine(engine, monkeypatch)
    space = spaces.Dict({"a": spaces.Box(0, 9, (3,), np.int32), "b": spaces.Tuple((spaces.Discrete(3),))})
    sample = {"a": np.array([1, 2, 3], np.int32), "b": (1,)}
    gc.collect()
    gc.disable()
    try:
        layout = Layout.from_space(space)
        row = np.zeros(layout.nbytes, np.uint8)
        layout.pack(sample, out=row)
        assert layout.unpack(row)["b"][0] == 1
        bound = layout.bind(row)
        bound.pack(sample)
        gone, row_gone = weakref.ref(layout), weakref.ref(bound)
        del layout, bound
        assert gone() is None, "the layout should be freed by reference counting alone"
        assert row_gone() is None, "the bound rows should be freed by reference counting alone"
    finally:
        gc.enable()
