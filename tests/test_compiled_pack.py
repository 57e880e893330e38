"""The compiled pack (one C call per sample) writes exactly the bytes of the checked Python path,
accepts nothing the Python path would refuse, and writes nothing when it refuses."""
from __future__ import annotations

import collections
import pickle

import gymnasium as gym
import minigrid  # noqa: F401  (registers the MiniGrid envs)
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from pack_engines import engine
from spaces_strategies import extreme, nested_spaces
from spaces_strategies import sample as draw
from test_layout_errors import SPACE, good

from packrl import EmulationError
from packrl.emulation import Layout, emulate
from packrl.emulation.codecs import TextCodec


def python_row(layout: Layout, sample) -> np.ndarray:
    row = np.zeros(layout.nbytes, np.uint8)
    layout.bind(row).pack_checked(sample)
    return row


def strided_read_only(value):
    """The same values in another memory layout: every array leaf strided and read-only."""
    if isinstance(value, dict):
        return {k: strided_read_only(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(strided_read_only(v) for v in value)
    if isinstance(value, np.ndarray) and value.ndim:
        wide = np.zeros(value.shape[:-1] + (value.shape[-1] * 2,), value.dtype)
        wide[..., ::2] = value
        out = wide[..., ::2]
        out.flags.writeable = False
        return out
    return value


@settings(max_examples=60)
@given(nested_spaces, st.integers(0, 2**31))
def test_compiled_rows_equal_python_rows_bit_for_bit(space, seed):
    layout = Layout.from_space(space)
    rng = np.random.default_rng(seed)
    space.seed(seed)
    sample = extreme(space, draw(space, rng), rng)
    compiled = layout.compiled_pack()
    assert compiled is not None
    rows = np.zeros((3, layout.nbytes), np.uint8)
    assert compiled.pack(sample, rows, 1) is True
    expected = python_row(layout, sample)
    assert rows[1].tobytes() == expected.tobytes()
    assert not rows[0].any() and not rows[2].any()
    # strided, read-only leaves are gathered, with the same bytes
    assert compiled.pack(strided_read_only(sample), rows, 2) is True
    assert rows[2].tobytes() == expected.tobytes()
    # pack_batch over a list goes through the compiled pack too
    assert layout.pack_batch([sample, sample]).tobytes() == expected.tobytes() * 2


BAD = {
    "Box above its bound": lambda s: s["obs"].__setitem__("level", np.int64(11)),
    "Discrete below start": lambda s: s["obs"].__setitem__("kind", 1),
    "Discrete as a float": lambda s: s["obs"].__setitem__("kind", 2.5),
    "Discrete as a bool": lambda s: s["obs"].__setitem__("kind", True),
    "Discrete beyond int64": lambda s: s["obs"].__setitem__("kind", 2**70),
    "MultiBinary 2": lambda s: s["obs"].__setitem__("buttons", np.array([1, 2, 0], np.int8)),
    "MultiDiscrete out of range": lambda s: s["obs"].__setitem__("choice", np.array([3, 3])),
    "wrong shape": lambda s: s["obs"].__setitem__("count", np.array([1, 2], np.uint8)),
    "wrong dtype, lossy": lambda s: s["obs"].__setitem__("count", np.array([1, 2, 300], np.int16)),
    "float into a float32 leaf, lossy": lambda s: s["obs"].__setitem__("pos", np.array([0.1, 0.2])),
    "a list for an array": lambda s: s["obs"].__setitem__("count", [1, 2, 3]),
    "missing key": lambda s: s["obs"].pop("flag"),
    "extra key": lambda s: s["obs"].__setitem__("extra", 1),
    "text outside the charset": lambda s: s["obs"].__setitem__("name", "xyz"),
    "tuple of wrong length": lambda s: s.__setitem__("pair", (1,)),
    "not a dict": lambda s: s.__setitem__("obs", [1, 2]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_compiled_pack_refuses_what_python_refuses_and_writes_nothing(case):
    layout = Layout.from_space(SPACE)
    compiled = layout.compiled_pack()
    rows = np.zeros((1, layout.nbytes), np.uint8)
    assert compiled.pack(good(), rows, 0) is True
    before = rows.copy()
    sample = good()
    BAD[case](sample)
    accepted = compiled.pack(sample, rows, 0)
    if accepted:  # only a lossless conversion may be accepted, and then the Python path agrees
        assert rows.tobytes() == python_row(layout, sample).tobytes()
    else:
        assert rows.tobytes() == before.tobytes()
    try:
        expected = python_row(layout, sample)
    except EmulationError as err:
        assert not accepted
        with pytest.raises(EmulationError) as again:
            layout.pack(sample, out=rows[0])  # the public path: compiled first, then the explanation
        assert str(again.value) == str(err)
        assert rows.tobytes() == before.tobytes(), "a refused sample must not change the row"
    else:
        assert layout.pack(sample, out=rows[0]).tobytes() == expected.tobytes()


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bound_row_refuses_like_the_python_path(case):
    layout = Layout.from_space(SPACE)
    row = np.zeros(layout.nbytes, np.uint8)
    bound = layout.bind(row)
    bound.pack(good())
    assert bound.spec is layout.packer.spec is not None, "a bound row packs through the compiled pack"
    before = row.copy()
    sample = good()
    BAD[case](sample)
    try:
        expected, message = python_row(layout, sample), None
    except EmulationError as err:
        expected, message, context = None, str(err), type(err.__context__)
    if message is None:
        bound.pack(sample)
        assert row.tobytes() == expected.tobytes()
        return
    with pytest.raises(EmulationError) as again:
        bound.pack(sample)
    assert str(again.value) == message
    assert type(again.value.__context__) is context, "the refusal should not chain the compiled path's exception"
    assert row.tobytes() == before.tobytes(), "a refused sample must not change the row"


def test_exact_conversions_still_pass_through_the_python_path():
    layout = Layout.from_space(SPACE)
    layout.compiled_pack()
    sample = good()
    sample["obs"]["count"] = np.array([1, 2, 255], np.int64)  # another dtype, every value fits
    assert layout.pack(sample).tobytes() == python_row(layout, good()).tobytes()


def test_the_first_sample_takes_the_compiled_pack(monkeypatch):
    space = spaces.Dict({"a": spaces.Box(0, 9, (4,), np.int32), "b": spaces.Discrete(3, start=-1)})
    layout = Layout.from_space(space)
    row = np.zeros(layout.nbytes, np.uint8)
    bound = layout.bind(row)

    def checked_path(*args):
        raise AssertionError("the checked Python path should not run for a sample C takes")

    monkeypatch.setattr(layout.packer, "write", checked_path)
    bound.pack({"a": np.full(4, 7, np.int32), "b": 1})
    assert layout.unpack(row)["a"].tolist() == [7] * 4 and layout.unpack(row)["b"] == 1
    assert layout.unpack(layout.pack({"a": np.full(4, 3, np.int32), "b": -1}))["b"] == -1
    assert layout.pack_batch([{"a": np.full(4, i, np.int32), "b": 0} for i in range(3)]).shape == (3, layout.nbytes)


def test_without_the_c_extension_the_python_path_packs_everything():
    space = spaces.Dict({"a": spaces.Box(0, 9, (4,), np.int32), "b": spaces.Tuple((spaces.Discrete(3),))})
    with engine("python"):
        layout = Layout.from_space(space)
    assert layout.compiled_pack() is None and layout.packer.spec is None
    sample = {"a": np.arange(4, dtype=np.int32), "b": (2,)}
    assert layout.pack(sample).tobytes() == Layout.from_space(space).pack(sample).tobytes()
    with pytest.raises(EmulationError, match=r"\['b'\]\[0\]"):
        layout.pack({"a": np.arange(4, dtype=np.int32), "b": (3,)})


def test_samples_of_other_dtypes_leave_the_compiled_pack_as_it_was():
    space = spaces.Dict({"x": spaces.Box(-1, 1, (3,), np.float32), "tag": spaces.Box(0, 1, (1,), np.int16)})
    layout = Layout.from_space(space, round_floats=True)
    compiled = layout.compiled_pack()
    row = np.zeros(layout.nbytes, np.uint8)
    rows = np.zeros((1, layout.nbytes), np.uint8)
    for i in range(40):
        value = np.array([0.1, -0.3, i / 100])  # float64, rounded into float32 through the Python path
        assert compiled.pack({"x": value, "tag": np.array([1], np.int16)}, rows, 0) is False
        layout.pack({"x": value, "tag": np.array([1], np.int16)}, out=row)
        assert layout.unpack(row)["x"].tolist() == value.astype(np.float32).tolist()
    assert compiled.pack({"x": np.zeros(3, np.float32), "tag": np.array([1], np.int16)}, rows, 0) is True


def test_minigrid_through_the_compiled_pack_equals_the_raw_env():
    raw, env = gym.make("MiniGrid-DoorKey-5x5-v0"), emulate(gym.make("MiniGrid-DoorKey-5x5-v0"))
    layout = env.emulated.observation
    obs, _ = env.reset(seed=3)
    raw_obs, _ = raw.reset(seed=3)
    rng = np.random.default_rng(3)
    for t in range(200):
        native = layout.to_native(layout.unpack(obs[0]))
        assert native["mission"] == raw_obs["mission"] and native["direction"] == raw_obs["direction"]
        assert np.array_equal(native["image"], raw_obs["image"])
        action = int(rng.integers(7))
        obs, _, terminals, truncations, _ = env.step(np.array([action]))
        raw_obs, _, terminated, truncated, _ = raw.step(action)
        if terminated or truncated:
            obs, _ = env.reset(seed=t)
            raw_obs, _ = raw.reset(seed=t)
    assert env._packer.spec is layout.packer.spec is not None


def test_a_float32_signalling_nan_keeps_its_payload_in_a_0d_leaf():
    space = spaces.Dict({"a": spaces.Box(-1, 1, (), np.float32), "b": spaces.Box(-1, 1, (), np.float64)})
    layout = Layout.from_space(space)
    assert layout.compiled_pack()
    snan32 = np.array(0x7F800015, np.uint32).view(np.float32)
    snan64 = np.array(0x7FF0000000000015, np.uint64).view(np.float64)
    rows = np.zeros((1, layout.nbytes), np.uint8)
    for sample in ({"a": snan32, "b": snan64}, {"a": snan32[()], "b": snan64[()]}):  # 0-d arrays, NumPy scalars
        assert layout.compiled_pack().pack(sample, rows, 0) is True, "the compiled path should take it"
        assert rows[0].tobytes() == python_row(layout, sample).tobytes()
        unpacked = layout.unpack(rows[0])
        assert unpacked["a"].view(np.uint32) == 0x7F800015 and unpacked["b"].view(np.uint64) == 0x7FF0000000000015
    row = np.zeros(layout.nbytes, np.uint8)
    bound = layout.bind(row)
    bound.pack({"a": snan32[()], "b": snan64[()]})
    assert layout.unpack(row)["a"].view(np.uint32) == 0x7F800015


def test_a_uint64_discrete_refuses_the_value_below_its_start():
    layout = Layout.from_space(spaces.Discrete(10, start=2**63, dtype=np.uint64))
    compiled = layout.compiled_pack()
    rows = np.zeros((1, layout.nbytes), np.uint8)
    # 2**63 - 1 and 2**63 are one float64: a comparison through float would let it in
    for value in (2**63 - 1, np.int64(2**63 - 1), np.uint64(2**63 - 1), 2**63 + 10):
        assert compiled.pack(value, rows, 0) is False and not rows.any()
        with pytest.raises(EmulationError, match="outside Discrete"):
            layout.pack(value)
    assert layout.unpack(layout.pack(2**63 + 9)) == 2**63 + 9


def test_layouts_of_the_same_structure_check_their_own_dtypes_and_charsets():
    # the same tree (one 0-d leaf, one checked string): other dtypes, other charsets, other bounds
    pairs = [(spaces.Box(-1, 1, (), np.float32), spaces.Box(-1, 1, (), np.float64)),
             (spaces.Text(3, charset="abc"), spaces.Text(3, charset="xyz")),
             (spaces.Box(0, 5, (2,), np.uint8), spaces.Box(0, 9, (2,), np.uint8))]
    for first, second in pairs:
        layouts = [Layout.from_space(first), Layout.from_space(second)]
        for layout, space in zip(layouts, (first, second)):
            space.seed(1)
            for _ in range(5):
                sample = space.sample()
                rows = np.zeros((1, layout.nbytes), np.uint8)
                assert layout.compiled_pack().pack(sample, rows, 0) is True, f"{space} refused its own sample"
                assert rows[0].tobytes() == python_row(layout, sample).tobytes()
    with pytest.raises(EmulationError):  # 7 is within the first Box's bounds only
        Layout.from_space(pairs[2][0]).pack(np.array([7, 7], np.uint8))


NESTED = spaces.Dict({
    "pair": spaces.Tuple((spaces.Discrete(5), spaces.Dict({"v": spaces.Box(-2, 2, (2, 3), np.int64)}))),
    "name": spaces.Text(4, charset="abcd"),
    "half": spaces.Box(-1, 1, (3,), np.float16),
    "flag": spaces.MultiBinary(2),
})


def nested_sample() -> dict:
    return {"pair": (4, {"v": np.full((2, 3), -2, np.int64)}), "name": "dab",
            "half": np.array([0.5, -1, np.nan], np.float16), "flag": np.array([1, 0], np.int8)}


@pytest.mark.parametrize("form", ["dict", "OrderedDict", "list for the tuple", "Fortran order", "a view of the row"])
def test_containers_and_memory_layouts_the_compiled_pack_takes(form):
    layout = Layout.from_space(NESTED)
    sample = nested_sample()
    expected = python_row(layout, sample)
    rows = np.zeros((1, layout.nbytes), np.uint8)
    if form == "OrderedDict":
        sample = collections.OrderedDict(sample)
    elif form == "list for the tuple":
        sample["pair"] = list(sample["pair"])
    elif form == "Fortran order":
        sample["pair"][1]["v"] = np.asfortranarray(sample["pair"][1]["v"])
    elif form == "a view of the row":
        rows[0] = expected
        sample = layout.to_native(layout.unpack(rows[0]))
        sample["pair"][1]["v"] = layout.unpack(rows[0])["pair"][1]["v"]
    assert layout.compiled_pack().pack(sample, rows, 0) is True
    assert rows[0].tobytes() == expected.tobytes()


def test_what_the_compiled_pack_leaves_to_the_python_path_packs_the_same():
    layout = Layout.from_space(NESTED)
    Pair = collections.namedtuple("Pair", "a b")
    rows = np.zeros((1, layout.nbytes), np.uint8)
    for change in ({"pair": Pair(4, {"v": np.full((2, 3), -2, np.int64)})},  # a tuple subclass
                   {"pair": (np.int32(4), {"v": np.full((2, 3), -2, np.int64)})},  # converts exactly
                   {"half": [0.5, -1.0, 0.25]}):
        sample = {**nested_sample(), **change}
        assert layout.compiled_pack().pack(sample, rows, 0) is False and not rows.any()
        assert layout.pack(sample).tobytes() == python_row(layout, sample).tobytes()


def test_many_leaves_and_a_pickled_layout_keep_the_compiled_pack():
    space = spaces.Dict({f"k{i}": spaces.Box(0, i + 1, (i % 3 + 1,), np.int32) for i in range(150)})
    layout = pickle.loads(pickle.dumps(Layout.from_space(space)))
    space.seed(0)
    sample = space.sample()
    rows = np.zeros((1, layout.nbytes), np.uint8)
    assert layout.compiled_pack().pack(sample, rows, 0) is True
    assert rows[0].tobytes() == python_row(layout, sample).tobytes()
    sample["k149"] = np.array([151], np.int32)
    assert layout.compiled_pack().pack(sample, rows, 0) is False


def test_an_interrupt_inside_a_codec_check_is_not_swallowed(monkeypatch):
    def interrupted(self, value, path, batch=()):
        raise KeyboardInterrupt

    monkeypatch.setattr(TextCodec, "check", interrupted)
    layout = Layout.from_space(spaces.Dict({"name": spaces.Text(3)}))
    with pytest.raises(KeyboardInterrupt):
        layout.compiled_pack().pack({"name": "ab"}, np.zeros((1, layout.nbytes), np.uint8), 0)
