"""Lossless round trips through pack/unpack and torch nativize, for random nested spaces."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st
from spaces_strategies import deep_spaces, extreme, nested_spaces
from spaces_strategies import sample as draw

from packrl import EmulationError
from packrl.emulation import Layout, TextView
from packrl.nativize import nativize


def assert_bit_equal(space, sample, unpacked, layout_codec_native):
    """Leaf by leaf: same dtype, same bytes (NaN payloads and -0.0 included)."""
    if isinstance(space, spaces.Dict):
        assert isinstance(unpacked, dict) and list(unpacked) == list(space.spaces)
        for k, s in space.spaces.items():
            assert_bit_equal(s, sample[k], unpacked[k], layout_codec_native)
    elif isinstance(space, spaces.Tuple):
        assert type(unpacked) is tuple and len(unpacked) == len(space.spaces)
        for s, x, u in zip(space.spaces, sample, unpacked):
            assert_bit_equal(s, x, u, layout_codec_native)
    elif isinstance(space, spaces.Text):
        assert isinstance(unpacked, TextView)
        assert layout_codec_native(space, unpacked) == sample
    else:
        expected = np.asarray(sample)
        got = unpacked.numpy() if isinstance(unpacked, torch.Tensor) else unpacked
        assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
        assert got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()


def text_native(space, view):
    chars, length = (np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v) for v in view)
    return "".join(space.character_list[int(i)] for i in chars[: int(length)])


def check_round_trip(space, seed):
    layout = Layout.from_space(space)
    space.seed(seed)
    rng = np.random.default_rng(seed)
    sample = extreme(space, draw(space, rng), rng)
    row = layout.pack(sample)
    assert row.dtype == np.uint8 and row.shape == (layout.nbytes,)
    unpacked = layout.unpack(row)
    assert_bit_equal(space, sample, unpacked, text_native)
    for leaf, view in zip(layout.leaves, layout.bind(row).views):
        assert np.shares_memory(view, row) or leaf.nbytes == 0
    tensors = nativize(torch.from_numpy(row), layout)
    assert_bit_equal(space, sample, tensors, text_native)
    return layout, sample, row


@given(nested_spaces, st.integers(0, 2**31))
def test_pack_unpack_is_bit_exact(space, seed):
    check_round_trip(space, seed)


@given(deep_spaces(), st.integers(0, 2**31))
def test_deeply_nested_round_trip(space, seed):
    check_round_trip(space, seed)


@given(nested_spaces, st.integers(0, 2**31), st.integers(1, 5))
def test_batch_pack_equals_single_packs_and_unpacks_to_views(space, seed, n):
    layout = Layout.from_space(space)
    space.seed(seed)
    rng = np.random.default_rng(seed)
    samples = [extreme(space, draw(space, rng), rng) for _ in range(n)]
    rows = layout.pack_batch(samples)
    assert rows.shape == (n, layout.nbytes)
    for i, s in enumerate(samples):
        assert rows[i].tobytes() == layout.pack(s).tobytes()
    batched = layout.unpack(rows)
    for leaf, view in zip(layout.leaves, layout.bind(rows).views):
        assert view.shape == (n, *leaf.shape) and view.dtype == leaf.dtype
    torch_views = nativize(torch.from_numpy(rows), layout)
    for i, s in enumerate(samples):
        assert_bit_equal(space, s, _index(batched, i), text_native)
        assert_bit_equal(space, s, _index(torch_views, i), text_native)


def _index(tree, i):
    if isinstance(tree, TextView):
        return TextView(tree.chars[i], tree.length[i])
    if isinstance(tree, dict):
        return {k: _index(v, i) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_index(v, i) for v in tree)
    return tree[i]


@given(nested_spaces)
def test_offsets_are_aligned_and_disjoint(space):
    layout = Layout.from_space(space)
    spans = sorted((leaf.offset, leaf.offset + leaf.nbytes) for leaf in layout.leaves if leaf.nbytes)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    for leaf in layout.leaves:
        assert leaf.offset % leaf.dtype.alignment == 0
        assert leaf.offset + leaf.nbytes <= layout.nbytes
    assert layout.nbytes % layout.alignment == 0


@given(nested_spaces)
def test_json_round_trip_equality_and_hash(space):
    layout = Layout.from_space(space)
    again = Layout.from_json(layout.to_json())
    assert again == layout and hash(again) == hash(layout)
    assert [leaf.offset for leaf in again.leaves] == [leaf.offset for leaf in layout.leaves]
    assert "offset" in repr(layout)


def test_layouts_of_different_spaces_differ():
    a = Layout.from_space(spaces.Dict({"x": spaces.Discrete(3)}))
    b = Layout.from_space(spaces.Dict({"x": spaces.Discrete(3, start=1)}))
    c = Layout.from_space(spaces.Dict({"x": spaces.Box(0, 1, (3,), np.float32)}))
    assert a != b and a != c and a == Layout.from_space(spaces.Dict({"x": spaces.Discrete(3)}))


def test_int64_and_uint64_extremes_survive():
    space = spaces.Dict({
        "i": spaces.Box(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (2,), np.int64),
        "u": spaces.Box(0, np.iinfo(np.uint64).max, (1,), np.uint64),
        "d": spaces.Discrete(2**62, start=-(2**62)),
    })
    sample = {"i": np.array([np.iinfo(np.int64).min, 2**53 + 1], np.int64),
              "u": np.array([np.iinfo(np.uint64).max], np.uint64), "d": 2**62 - 1 - 2**62}
    layout = Layout.from_space(space)
    out = layout.unpack(layout.pack(sample))
    assert out["i"].tolist() == [np.iinfo(np.int64).min, 2**53 + 1]
    assert out["u"].tolist() == [2**64 - 1]
    assert int(out["d"]) == -1 and out["d"].dtype == np.int64


def test_scalar_leaves_are_batch_shaped_not_column_shaped():
    layout = Layout.from_space(spaces.Tuple((spaces.Discrete(4), spaces.Box(0, 1, (), np.float32))))
    rows = layout.pack_batch([(1, np.float32(0.5)), (3, np.float32(0.25))])
    d, b = layout.unpack(rows)
    assert d.shape == (2,) and b.shape == (2,)
    td, tb = nativize(torch.from_numpy(rows), layout)
    assert td.shape == (2,) and tb.shape == (2,)
    assert td.tolist() == [1, 3] and tb.tolist() == [0.5, 0.25]


def test_pack_batch_accepts_a_batched_structure():
    space = spaces.Dict({"a": spaces.Box(-1, 1, (2,), np.float32), "b": spaces.Discrete(5, start=10)})
    batched = {"a": np.zeros((3, 2), np.float32), "b": np.array([10, 11, 14])}
    rows = Layout.from_space(space).pack_batch(batched)
    assert Layout.from_space(space).unpack(rows)["b"].tolist() == [10, 11, 14]


def test_unpack_returns_views_that_see_writes():
    layout = Layout.from_space(spaces.Dict({"x": spaces.Box(-10, 10, (2,), np.float64)}))
    row = layout.pack({"x": np.array([1.0, 2.0])})
    view = layout.unpack(row)["x"]
    layout.pack({"x": np.array([3.0, 4.0])}, out=row)
    assert view.tolist() == [3.0, 4.0]


def test_tuple_comes_back_as_tuple_and_int_keys_are_kept():
    space = spaces.Dict({0: spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))), "k": spaces.MultiBinary(2)})
    layout = Layout.from_space(space)
    out = layout.unpack(layout.pack({0: (1, 2), "k": np.array([1, 0], np.int8)}))
    assert type(out[0]) is tuple and out[0][1] == 2 and set(out) == {0, "k"}
    assert Layout.from_json(layout.to_json()).unpack(layout.pack({0: (1, 2), "k": np.array([1, 0], np.int8)}))[0][0] == 1


@pytest.mark.parametrize("dtype", ["bool", "uint16", "uint32", "uint64", "float16", "float64", "int8"])
def test_torch_views_keep_exact_dtypes(dtype):
    space = spaces.Box(0, 1, (3,), np.dtype(dtype)) if dtype != "bool" else spaces.Box(0, 1, (3,), bool)
    layout = Layout.from_space(spaces.Dict({"x": space, "pad": spaces.Discrete(3)}))
    row = layout.pack({"x": np.ones(3, dtype=np.dtype(dtype)), "pad": 2})
    tensor = torch.from_numpy(row)
    view = nativize(tensor, layout)["x"]
    assert str(view.dtype) == f"torch.{dtype}"
    assert view.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()


def test_zero_rows_and_empty_containers():
    layout = Layout.from_space(spaces.Dict({"a": spaces.Box(0, 9, (2,), np.int64), "e": spaces.Dict({}), "t": spaces.Tuple(())}))
    views = layout.unpack(np.zeros((0, layout.nbytes), np.uint8))
    assert views["a"].shape == (0, 2) and views["e"] == {} and views["t"] == ()
    assert layout.pack_batch([]).shape == (0, layout.nbytes)
    assert layout.unpack(layout.pack({"a": np.array([1, 9]), "e": {}, "t": ()}))["a"].tolist() == [1, 9]


def test_a_batched_structure_whose_first_child_is_empty():
    layout = Layout.from_space(spaces.Dict({"e": spaces.Tuple(()), "f": spaces.Dict({}), "x": spaces.Discrete(2)}))
    rows = layout.pack_batch({"e": (), "f": {}, "x": np.array([0, 1])})
    assert rows.shape == (2, layout.nbytes)
    assert layout.unpack(rows)["x"].tolist() == [0, 1]


def test_numpy_scalar_dict_keys_round_trip_and_odd_keys_are_named():
    space = spaces.Dict({np.int64(3): spaces.Discrete(2), "a": spaces.Dict({np.int64(7): spaces.Box(0, 1, (2,), np.float32)})})
    layout = Layout.from_space(space)
    space.seed(0)
    sample = space.sample()
    unpacked = layout.unpack(layout.pack(sample))
    assert list(unpacked) == [np.int64(3), "a"] and np.array_equal(unpacked["a"][7], sample["a"][np.int64(7)])
    again = Layout.from_json(layout.to_json())
    assert again == layout and again.pack(sample).tobytes() == layout.pack(sample).tobytes()
    with pytest.raises(EmulationError, match=r"at \['x'\]: Dict key frozenset"):
        Layout.from_space(spaces.Dict({"x": spaces.Dict({frozenset([1]): spaces.Discrete(2)})}))


@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.bool_, np.float32, np.float64])
def test_to_native_gives_what_box_sample_gives_for_a_0d_box(dtype):
    space = spaces.Box(0, 1, (), dtype)
    space.seed(0)
    sample = space.sample()
    layout = Layout.from_space(space)
    native = layout.to_native(layout.unpack(layout.pack(sample)))
    assert type(native) is type(sample) and native.dtype == sample.dtype and native == sample
