"""The C extension packrl.emulation._fastpack: built by the project's install, walking a sample's
tree and taking exactly what it should, handing everything else to the checked Python path (which
test_compiled_pack.py compares it with)."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from gymnasium import spaces

from packrl import EmulationError
from packrl.emulation import (
    Layout,
    _fastpack,  # a failed build must fail here, not be skipped
    emulate,
)

SPACE = spaces.Dict({
    "glyphs": spaces.Box(0, 5976, (3, 4), np.int16),
    "level": spaces.Box(np.array([0, 1, 2]), np.array([5, 6, 7]), (3,), np.uint32),  # elementwise bounds
    "pos": spaces.Box(-1, 1, (2,), np.float32),
    "kind": spaces.Discrete(3, start=-1),
})


def good() -> dict:
    return {"glyphs": np.full((3, 4), 7, np.int16), "level": np.array([0, 6, 7], np.uint32),
            "pos": np.array([0.5, np.nan], np.float32), "kind": -1}


def test_the_install_built_the_c_extension_and_layouts_use_it():
    layout = Layout.from_space(SPACE)
    assert layout.packer.spec is not None and layout.compiled_pack() is not None


def c_parts():
    layout = Layout.from_space(SPACE)
    order = [leaf.path[0] for leaf in layout.leaves]  # field ids: glyphs, kind, level, pos
    return layout, layout.packer.spec, order


def test_c_writes_the_python_paths_bytes_and_refuses_without_writing():
    layout, spec, order = c_parts()
    rows = np.full((2, layout.nbytes), 0xAB, np.uint8)
    assert _fastpack.pack(spec, good(), rows, 1) == 0
    assert rows[1].tobytes() == layout.pack(good()).tobytes(), "padding zeroed, every leaf in place"
    assert (rows[0] == 0xAB).all()
    before = rows.copy()
    for name, bad in [("glyphs", np.full((3, 4), 5977, np.int16)), ("level", np.array([0, 7, 7], np.uint32)),
                      ("level", np.array([0, 0, 7], np.uint32)), ("kind", np.int64(2)), ("kind", 2), ("kind", -2),
                      ("kind", 2**64), ("kind", -(2**70))]:
        sample = good()
        sample[name] = bad
        code = _fastpack.pack(spec, sample, rows, 1)
        assert code == order.index(name) + 1, f"{name}: out of bounds should name field {order.index(name)}"
        assert rows.tobytes() == before.tobytes()
        with pytest.raises(EmulationError, match=name):
            layout.pack(sample)


TAKEN = {
    "strided": lambda s: s.__setitem__("glyphs", np.repeat(s["glyphs"], 2, axis=1)[:, ::2]),
    "reversed": lambda s: s.__setitem__("glyphs", np.arange(12, dtype=np.int16).reshape(3, 4)[::-1, ::-1]),
    "Fortran order": lambda s: s.__setitem__("glyphs", np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))),
    "misaligned": lambda s: s.__setitem__("glyphs", np.frombuffer(
        b"\0" + np.full(12, 7, np.int16).tobytes(), np.int16, offset=1).reshape(3, 4)),
    "read-only": lambda s: s["glyphs"].setflags(write=False),
    "a 0-d array Discrete": lambda s: s.__setitem__("kind", np.array(1)),
    "an int64 Discrete": lambda s: s.__setitem__("kind", np.int64(1)),
    "an OrderedDict": lambda s: s.update(collections.OrderedDict(s)),
}

NOT_TAKEN = {
    "another dtype": lambda s: s.__setitem__("glyphs", s["glyphs"].astype(np.int32)),
    "same itemsize, other kind": lambda s: s.__setitem__("glyphs", s["glyphs"].astype(np.uint16)),
    "byte-swapped": lambda s: s.__setitem__("glyphs", s["glyphs"].astype(">i2")),
    "a subclass": lambda s: s.__setitem__("glyphs", np.ma.masked_array(s["glyphs"])),
    "another rank": lambda s: s.__setitem__("glyphs", s["glyphs"].reshape(12)),
    "a list": lambda s: s.__setitem__("pos", [0.5, 0.25]),
    "a NumPy int32 Discrete": lambda s: s.__setitem__("kind", np.int32(0)),
    "a bool Discrete": lambda s: s.__setitem__("kind", True),
    "a float Discrete": lambda s: s.__setitem__("kind", 1.0),
    "a missing key": lambda s: s.pop("pos"),
    "an extra key": lambda s: s.__setitem__("extra", 1),
}


@pytest.mark.parametrize("case", sorted(TAKEN) + sorted(NOT_TAKEN))
def test_c_takes_exactly_the_leaf_in_any_memory_layout_and_the_layout_still_decides(case):
    layout, spec, _ = c_parts()
    sample = good()
    (TAKEN.get(case) or NOT_TAKEN[case])(sample)
    if case == "an OrderedDict":
        sample = collections.OrderedDict(sample)
    rows = np.zeros((1, layout.nbytes), np.uint8)
    code = _fastpack.pack(spec, sample, rows, 0)
    expected = np.zeros(layout.nbytes, np.uint8)
    if case in TAKEN:
        assert code == 0
        layout.bind(expected).pack_checked(sample)
        assert rows[0].tobytes() == expected.tobytes()
        return
    assert code == -1
    assert not rows.any()
    try:  # the public path: what converts exactly is packed, what does not is named
        layout.bind(expected).pack_checked(sample)
    except EmulationError:
        with pytest.raises(EmulationError):
            layout.pack(sample, out=rows[0])
        assert not rows.any()
    else:
        assert layout.pack(sample, out=rows[0]).tobytes() == expected.tobytes()


def test_pack_many_stops_at_the_first_sample_it_does_not_take():
    layout, spec, _ = c_parts()
    rows = np.zeros((4, layout.nbytes), np.uint8)
    bad = {**good(), "kind": 5}
    assert _fastpack.pack_many(spec, [good(), good(), bad, good()], rows, 0) == 2
    assert rows[0].tobytes() == rows[1].tobytes() == layout.pack(good()).tobytes() and not rows[2:].any()
    assert _fastpack.pack_many(spec, [good()], rows, 3) == 1 and rows[3].any()
    with pytest.raises(IndexError):
        _fastpack.pack_many(spec, [good(), good()], rows, 3)
    with pytest.raises(TypeError, match="list"):
        _fastpack.pack_many(spec, (good(),), rows, 0)


def test_bad_calls_raise_instead_of_writing_anywhere():
    layout, spec, _ = c_parts()
    rows = np.zeros((2, layout.nbytes), np.uint8)
    with pytest.raises(IndexError, match="row 2 of 2"):
        _fastpack.pack(spec, good(), rows, 2)
    with pytest.raises(IndexError):
        _fastpack.pack(spec, good(), rows, -1)
    with pytest.raises(IndexError, match="row 1 of 1"):
        _fastpack.pack(spec, good(), rows[0], 1)
    with pytest.raises(TypeError, match="pack"):
        _fastpack.pack(spec, good(), rows)
    for wrong in (np.zeros((2, layout.nbytes + 1), np.uint8), np.zeros((2, layout.nbytes), np.int8),
                  np.zeros((layout.nbytes, 2), np.uint8).T, np.zeros((1, 2, layout.nbytes), np.uint8)):
        with pytest.raises(ValueError, match="writable C-contiguous"):
            _fastpack.pack(spec, good(), wrong, 0)
    read_only = rows.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _fastpack.pack(spec, good(), read_only, 0)
    with pytest.raises(ValueError, match="PyCapsule"):
        _fastpack.pack("not a spec", good(), rows, 0)
    assert not rows.any()


ONE = ("i", 2, (2,), 0, None, None, None, False)


@pytest.mark.parametrize("field, message", [
    (("i", 2, (3, 4), 20, None, None, None, False), "does not fit in the row"),
    (("i", 3, (2,), 0, None, None, None, False), "itemsize of 1, 2, 4 or 8"),
    (("c", 8, (2,), 0, None, None, None, False), "one of 'biuf'"),
    (("f", 4, (2,), 0, 0, 1, None, False), "only integer and bool fields have bounds"),
    (("i", 8, (), 0, None, None, None, True), "takes Python ints"),
    (("i", 8, (2,), 0, 0, 1, None, True), "takes Python ints"),
    (("i", 8, (2,), 0, None, None, np.int64, False), "shape \\(\\)"),
    (("i", 4, (), 0, None, None, np.int64, False), "class must have the field's dtype"),
    (("u", 2, (2,), 0, np.zeros(3, np.uint16), np.ones(3, np.uint16), None, False), "width and size"),
    (("b", 1, (2,), 0, np.zeros(2, bool), np.ones(2, bool), None, False), "width and size"),
])
def test_a_malformed_field_is_refused_when_the_spec_is_made(field, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _fastpack.make_spec(24, (), (field,), ((None, (), 0, 1),), 0)


@pytest.mark.parametrize("leaves, tree, message", [
    (((None, (), 0, 1),), 1, "once each, in order"),
    (((None, (), 0, 1),), (None, (0, 0)), "once each, in order"),
    (((None, (), 0, 1),), (("a", "b"), (0,)), "one key per child"),
    (((None, (), 0, 1),), [None, (0,)], "a leaf index or"),
    (((None, (), 0, 2),), 0, "one field unless a callable"),
    (((len, (), 1, 1),), 0, "in order"),
    ((), (None, ()), "take every field"),
])
def test_a_malformed_tree_is_refused_when_the_spec_is_made(leaves, tree, message):
    with pytest.raises(ValueError, match=message):
        _fastpack.make_spec(24, (), (ONE,), leaves, tree)
    with pytest.raises(ValueError, match="gap outside the row"):
        _fastpack.make_spec(24, ((20, 30),), (ONE,), ((None, (), 0, 1),), 0)


# ------------------------------------------------------------------ the Discrete action lookup

def test_emulate_takes_an_int_action_as_the_array_and_refuses_what_is_out_of_range():
    env = emulate(__import__("gymnasium").make("FrozenLake-v1"))
    raw = __import__("gymnasium").make("FrozenLake-v1")
    env.reset(seed=1)
    raw.reset(seed=1)
    for action in (1, np.int64(2), np.array([1]), np.array(2), 1, 2):
        obs, *_ = env.step(action)
        raw_obs, *_ = raw.step(int(np.asarray(action).reshape(-1)[0]))
        assert env.emulated.observation.unpack(obs[0]) == raw_obs
    for bad in (4, -1, np.array([4]), np.array([1.5]), 2**64):  # (1.0 and True convert exactly: taken)
        with pytest.raises(EmulationError, match="agent_0"):
            env.step(bad)
