"""Every kind of bad input is refused with EmulationError/NativizeError naming the leaf path."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pack_engines import ENGINES, use_engine

from packrl import EmulationError, NativizeError
from packrl.emulation import BoundedString, Layout, LeafCodec, bounded_string, register_space
from packrl.nativize import nativize

SPACE = spaces.Dict({
    "obs": spaces.Dict({
        "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
        "count": spaces.Box(0, 255, (3,), np.uint8),
        "level": spaces.Box(0, 10, (), np.int64),
        "kind": spaces.Discrete(4, start=2),
        "buttons": spaces.MultiBinary(3),
        "choice": spaces.MultiDiscrete([3, 5], start=[1, -2]),
        "name": spaces.Text(5, charset="abc"),
        "flag": spaces.Box(0, 1, (2,), bool),
    }),
    "pair": spaces.Tuple((spaces.Discrete(2), spaces.Box(-np.inf, np.inf, (1,), np.float64))),
})


def good():
    return {"obs": {"pos": np.array([0.5, -0.25], np.float32), "count": np.array([1, 2, 255], np.uint8),
                    "level": np.int64(3), "kind": 5, "buttons": np.array([1, 0, 1], np.int8),
                    "choice": np.array([3, 2]), "name": "abca", "flag": np.array([True, False])},
            "pair": (1, np.array([1e300]))}


LAYOUT = Layout.from_space(SPACE)


def assert_refused(sample, *words):
    with pytest.raises(EmulationError) as err:
        LAYOUT.pack(sample)
    for word in words:
        assert word in str(err.value), str(err.value)
    return str(err.value)


def test_good_sample_packs():
    assert LAYOUT.unpack(LAYOUT.pack(good()))["pair"][1][0] == 1e300


def test_missing_key_is_named():
    s = good()
    del s["obs"]["kind"]
    assert_refused(s, "missing", "['obs']['kind']")


def test_extra_key_is_named():
    s = good()
    s["obs"]["surprise"] = 1
    assert_refused(s, "unexpected", "['obs']['surprise']")


def test_wrong_shape_is_named():
    s = good()
    s["obs"]["pos"] = np.zeros(3, np.float32)
    assert_refused(s, "['obs']['pos']", "shape")


def test_float_overflow_into_float32_is_refused():
    s = good()
    s["obs"]["pos"] = np.array([1e300, 0.0])
    assert_refused(s, "['obs']['pos']", "1e+300")


def test_rounding_float64_into_float32_is_refused_unless_allowed():
    s = good()
    s["obs"]["pos"] = np.array([0.1, 0.0])
    assert_refused(s, "['obs']['pos']", "round")
    lenient = Layout.from_space(SPACE, round_floats=True)
    assert lenient.unpack(lenient.pack(s))["obs"]["pos"][0] == np.float32(0.1)
    exact = good()
    exact["obs"]["pos"] = np.array([0.5, -0.25])  # float64 values that float32 holds exactly
    LAYOUT.pack(exact)


def test_300_into_uint8_is_refused():
    s = good()
    s["obs"]["count"] = np.array([1, 2, 300])
    assert_refused(s, "['obs']['count']", "300")


def test_fraction_into_int_leaf_is_refused():
    s = good()
    s["obs"]["level"] = 2.5
    assert_refused(s, "['obs']['level']", "2.5")
    s["obs"]["level"] = 2.0  # an exact integer in a float is accepted
    assert LAYOUT.unpack(LAYOUT.pack(s))["obs"]["level"] == 2


def test_integer_box_bounds_are_checked():
    s = good()
    s["obs"]["level"] = 11
    assert_refused(s, "['obs']['level']", "11", "bounds")


def test_discrete_out_of_range_respects_start():
    s = good()
    s["obs"]["kind"] = 1  # start is 2
    assert_refused(s, "['obs']['kind']", "start=2")
    s["obs"]["kind"] = 6
    assert_refused(s, "['obs']['kind']", "6")


def test_multidiscrete_out_of_range_names_index():
    s = good()
    s["obs"]["choice"] = np.array([3, 3])  # second branch is start -2, n 5: [-2, 2]
    assert_refused(s, "['obs']['choice']", "index (1,)")


def test_multibinary_must_be_binary():
    s = good()
    s["obs"]["buttons"] = np.array([1, 2, 0], np.int8)
    assert_refused(s, "['obs']['buttons']", "0 or 1")


def test_bool_leaf_refuses_non_binary():
    s = good()
    s["obs"]["flag"] = np.array([2, 0])
    assert_refused(s, "['obs']['flag']")
    s["obs"]["flag"] = np.array([1, 0])
    assert LAYOUT.unpack(LAYOUT.pack(s))["obs"]["flag"].tolist() == [True, False]


def test_text_too_long_is_refused_not_cut():
    s = good()
    s["obs"]["name"] = "abcabc"
    assert_refused(s, "['obs']['name']", "length 6")


def test_text_char_outside_charset():
    s = good()
    s["obs"]["name"] = "abz"
    assert_refused(s, "['obs']['name']", "'z'")


def test_strings_where_numbers_belong():
    s = good()
    s["obs"]["pos"] = "left"
    assert_refused(s, "['obs']['pos']")


def test_tuple_of_wrong_length():
    s = good()
    s["pair"] = (1,)
    assert_refused(s, "['pair']", "tuple of 2")


def test_int64_beyond_float64_precision_is_refused():
    layout = Layout.from_space(spaces.Box(-np.inf, np.inf, (1,), np.float64))
    with pytest.raises(EmulationError, match="exactly representable"):
        layout.pack(np.array([2**53 + 1], np.int64))
    layout.pack(np.array([2**53], np.int64))


def test_negative_into_uint64_is_refused():
    layout = Layout.from_space(spaces.Box(0, 2**64 - 1, (1,), np.uint64))
    with pytest.raises(EmulationError, match="-1"):
        layout.pack(np.array([-1], np.int64))


@pytest.mark.parametrize("space, name", [
    (spaces.Sequence(spaces.Discrete(3)), "Sequence"),
    (spaces.Graph(spaces.Box(0, 1, (2,)), spaces.Discrete(2)), "Graph"),
    (spaces.OneOf([spaces.Discrete(2), spaces.Box(0, 1, (2,))]), "OneOf"),
])
def test_unpackable_spaces_are_refused_with_path(space, name):
    with pytest.raises(EmulationError) as err:
        Layout.from_space(spaces.Dict({"outer": spaces.Tuple((spaces.Discrete(2), space))}))
    assert "['outer'][1]" in str(err.value) and "register_space" in str(err.value)


def test_unknown_custom_space_is_refused_and_can_be_registered():
    class Color(spaces.Space):
        def __init__(self):
            super().__init__(shape=None, dtype=None)

    with pytest.raises(EmulationError, match="Color"):
        Layout.from_space(spaces.Dict({"c": Color()}))
    register_space(Color, bounded_string(8))
    layout = Layout.from_space(spaces.Dict({"c": Color()}))
    assert layout.to_native(layout.unpack(layout.pack({"c": "red"}))) == {"c": "red"}
    with pytest.raises(EmulationError, match="length 9"):
        layout.pack({"c": "turquoise"})


def test_user_codec_subclass_round_trips_through_json():
    class Angle(spaces.Space):
        def __init__(self):
            super().__init__(shape=(), dtype=np.float32)

    class AngleCodec(LeafCodec):
        kind = "test_angle"

        def __init__(self, space=None):
            from packrl.emulation.codecs import Field
            self.space = space or Angle()
            self.fields = (Field(None, np.dtype(np.float32), (2,)),)

        def spec(self):
            return {"kind": self.kind}

        @classmethod
        def from_spec(cls, spec):
            return cls()

        def check(self, value, path, batch=()):
            value = np.asarray(value, np.float64)
            return (np.stack([np.cos(value), np.sin(value)], -1).astype(np.float32),)

    register_space(Angle, AngleCodec)
    layout = Layout.from_space(spaces.Dict({"a": Angle()}))
    assert np.allclose(layout.unpack(layout.pack({"a": 0.0}))["a"], [1.0, 0.0])
    assert Layout.from_json(layout.to_json()) == layout


def test_bounded_string_space():
    layout = Layout.from_space(spaces.Dict({"s": BoundedString(4)}))
    assert layout.to_native(layout.unpack(layout.pack({"s": "ab"})))["s"] == "ab"
    with pytest.raises(EmulationError, match="never cuts"):
        layout.pack({"s": "abcde"})


def test_unpack_refuses_wrong_buffers():
    with pytest.raises(EmulationError, match="uint8"):
        LAYOUT.unpack(np.zeros(LAYOUT.nbytes, np.float32))
    with pytest.raises(EmulationError, match=str(LAYOUT.nbytes)):
        LAYOUT.unpack(np.zeros(LAYOUT.nbytes + 1, np.uint8))


def test_nativize_refuses_float_tensor_and_names_the_cause():
    row = LAYOUT.pack(good())
    with pytest.raises(NativizeError) as err:
        nativize(torch.Tensor(row), LAYOUT)
    assert "float32" in str(err.value) and "torch.Tensor(obs)" in str(err.value)
    with pytest.raises(NativizeError, match="bytes"):
        nativize(torch.zeros(LAYOUT.nbytes - 1, dtype=torch.uint8), LAYOUT)


def test_batch_errors_name_the_sample():
    s1, s2 = good(), good()
    del s2["obs"]["pos"]
    with pytest.raises(EmulationError, match="sample 1"):
        LAYOUT.pack_batch([s1, s2])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_refused_batch_leaves_out_unchanged(engine, monkeypatch):
    use_engine(engine, monkeypatch)
    layout = Layout.from_space(SPACE)
    out = np.full((3, layout.nbytes), 7, np.uint8)
    bad = good()
    bad["obs"]["kind"] = 9
    with pytest.raises(EmulationError, match=r"\['obs'\]\['kind'\]"):
        layout.pack_batch([good(), good(), bad], out=out)
    assert (out == 7).all(), "a refused batch must not change the rows it was given"
    layout.pack_batch([good(), good(), good()], out=out)
    assert out.tobytes() == layout.pack(good()).tobytes() * 3


def test_python_ints_beyond_int64_are_exact_or_refused():
    layout = Layout.from_space(spaces.Dict({"u": spaces.Box(0, 2**64 - 1, (2,), np.uint64),
                                            "d": spaces.Discrete(4, start=2**63, dtype=np.uint64)}))
    # NumPy reads [2**63 + 1, 0] as float64, where 2**63 + 1 becomes 2**63
    row = layout.pack({"u": [2**63 + 1, 0], "d": 2**63 + 3})
    assert layout.unpack(row)["u"].tolist() == [2**63 + 1, 0]
    assert layout.unpack(layout.pack({"u": [2**64 - 1, 0.0], "d": 2**63}))["u"].tolist() == [2**64 - 1, 0]
    batch = layout.pack_batch([{"u": [2**63 + 1, 1], "d": 2**63}, {"u": [5, 2**64 - 1], "d": 2**63 + 1}])
    assert layout.unpack(batch)["u"].tolist() == [[2**63 + 1, 1], [5, 2**64 - 1]]
    for value, words in [([2**64, 0], "does not fit uint64"), ([1.5, 0], "is not an integer"),
                         ([-1, 2**63], "does not fit uint64")]:
        with pytest.raises(EmulationError) as err:
            layout.pack({"u": value, "d": 2**63})
        assert "['u']" in str(err.value) and words in str(err.value)


def test_malformed_batched_structures_are_named():
    pair = Layout.from_space(spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))))
    for bad in ({"a": 1}, 5, (np.array([0]),)):
        with pytest.raises(EmulationError, match="expected a tuple of 2 batched items"):
            pair.pack_batch(bad)
    with pytest.raises(EmulationError, match="a list of samples"):
        LAYOUT.pack_batch((good(), good()))


def test_a_float64_nan_payload_float32_cannot_hold_is_refused():
    layout = Layout.from_space(spaces.Box(-np.inf, np.inf, (2,), np.float32))
    payload = np.array([0x7FF0000000000015, 0], np.uint64).view(np.float64)
    with pytest.raises(EmulationError, match="NaN whose payload float32 cannot hold"):
        layout.pack(payload)
    plain = layout.unpack(layout.pack(np.array([np.nan, -np.nan])))  # the common NaNs narrow exactly
    assert plain.view(np.uint32).tolist() == [0x7FC00000, 0xFFC00000]
    rounding = Layout.from_space(spaces.Box(-np.inf, np.inf, (2,), np.float32), round_floats=True)
    assert np.isnan(rounding.unpack(rounding.pack(payload))[0])


@pytest.mark.parametrize("shape", [(), (3,)])
def test_an_integer_a_float64_leaf_cannot_hold_exactly_is_refused_by_name(shape):
    """2**53 + 1 is no float64: refused naming the leaf, for a 0-d leaf too (a raw NumPy error before)."""
    layout = Layout.from_space(spaces.Dict({"x": spaces.Box(-np.inf, np.inf, shape, np.float64)}))
    value = 2**53 + 1 if shape == () else np.array([1, 2**53 + 1, 3], np.int64)
    with pytest.raises(EmulationError, match=r"leaf \['x'\].*not exactly representable in float64"):
        layout.pack({"x": value})
    exact = 2**53 if shape == () else np.array([1, 2**53, 3], np.int64)
    assert layout.unpack(layout.pack({"x": exact}))["x"].tolist() == (float(2**53) if shape == () else [1.0, 2.0**53, 3.0])
