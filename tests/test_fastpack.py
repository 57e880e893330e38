"""The C extension packrl.emulation._fastpack: built by the project's install, taking exactly what
it should and handing everything else to the Numba and Python paths (which test_compiled_pack.py
runs with either first kernel)."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from packrl import EmulationError
from packrl.emulation import (
    Layout,
    _fastpack,  # a failed build must fail here, not be skipped
    emulate,
)
from packrl.emulation import compiled as compiled_module

SPACE = spaces.Dict({
    "glyphs": spaces.Box(0, 5976, (3, 4), np.int16),
    "level": spaces.Box(np.array([0, 1, 2]), np.array([5, 6, 7]), (3,), np.uint32),  # elementwise bounds
    "pos": spaces.Box(-1, 1, (2,), np.float32),
    "kind": spaces.Discrete(3, start=-1),
})


def good() -> dict:
    return {"glyphs": np.full((3, 4), 7, np.int16), "level": np.array([0, 6, 7], np.uint32),
            "pos": np.array([0.5, np.nan], np.float32), "kind": -1}


def test_the_install_built_the_c_extension_and_hot_layouts_use_it(monkeypatch):
    monkeypatch.delenv("PACKRL_PACK_KERNEL", raising=False)
    assert compiled_module.fast_kernel_in_use()
    compiled = Layout.from_space(SPACE).compiled_pack()
    assert compiled.module._fast is _fastpack.pack
    assert not hasattr(compiled.module, "_kernel"), "no Numba kernel should compile while C takes every leaf"


def test_an_unknown_kernel_name_is_refused(monkeypatch):
    monkeypatch.setenv("PACKRL_PACK_KERNEL", "cuda")
    with pytest.raises(ValueError, match="PACKRL_PACK_KERNEL"):
        compiled_module.fast_kernel_in_use()


def fast_parts(monkeypatch):
    monkeypatch.setenv("PACKRL_PACK_KERNEL", "auto")
    layout = Layout.from_space(SPACE)
    module = layout.compiled_pack().module
    # the kernel's arguments are the leaves in layout order: glyphs, kind, level, pos
    order = [leaf.path[0] for leaf in layout.leaves]
    return layout, module._spec, order


def leaves_of(sample: dict, order: list) -> list:
    return [sample[name] for name in order]


def test_c_writes_the_python_paths_bytes_and_refuses_without_writing(monkeypatch):
    layout, spec, order = fast_parts(monkeypatch)
    rows = np.full((2, layout.nbytes), 0xAB, np.uint8)
    assert _fastpack.pack(spec, rows, 1, *leaves_of(good(), order)) == 0
    assert rows[1].tobytes() == layout.pack(good()).tobytes(), "padding zeroed, every leaf in place"
    assert (rows[0] == 0xAB).all()
    before = rows.copy()
    for name, bad in [("glyphs", np.full((3, 4), 5977, np.int16)), ("level", np.array([0, 7, 7], np.uint32)),
                      ("level", np.array([0, 0, 7], np.uint32)), ("kind", 2)]:
        sample = good()
        sample[name] = bad
        code = _fastpack.pack(spec, rows, 1, *leaves_of(sample, order))
        assert code == order.index(name) + 1, f"{name}: out of bounds should name leaf {order.index(name)}"
        assert rows.tobytes() == before.tobytes()
        with pytest.raises(EmulationError, match=name):
            layout.pack(sample)


NOT_TAKEN = {
    "another dtype": lambda s: s.__setitem__("glyphs", s["glyphs"].astype(np.int32)),
    "same itemsize, other kind": lambda s: s.__setitem__("glyphs", s["glyphs"].astype(np.uint16)),
    "byte-swapped": lambda s: s.__setitem__("glyphs", s["glyphs"].astype(">i2")),
    "strided": lambda s: s.__setitem__("glyphs", np.repeat(s["glyphs"], 2, axis=1)[:, ::2]),
    "Fortran order": lambda s: s.__setitem__("glyphs", np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))),
    "misaligned": lambda s: s.__setitem__("glyphs", np.frombuffer(
        b"\0" + np.full(12, 7, np.int16).tobytes(), np.int16, offset=1).reshape(3, 4)),
    "a subclass": lambda s: s.__setitem__("glyphs", np.ma.masked_array(s["glyphs"])),
    "another rank": lambda s: s.__setitem__("glyphs", s["glyphs"].reshape(12)),
    "a list": lambda s: s.__setitem__("pos", [0.5, 0.25]),
    "a NumPy int32 Discrete": lambda s: s.__setitem__("kind", np.int32(0)),
    "a bool Discrete": lambda s: s.__setitem__("kind", True),
    "a Discrete beyond int64": lambda s: s.__setitem__("kind", 2**64),
}


@pytest.mark.parametrize("case", sorted(NOT_TAKEN))
def test_c_does_not_take_what_is_not_exactly_the_leaf_and_the_layout_still_decides(case, monkeypatch):
    layout, spec, order = fast_parts(monkeypatch)
    sample = good()
    NOT_TAKEN[case](sample)
    rows = np.zeros((1, layout.nbytes), np.uint8)
    assert _fastpack.pack(spec, rows, 0, *leaves_of(sample, order)) == -1
    assert not rows.any()
    try:  # the public path: what converts exactly is packed, what does not is named
        expected = np.zeros(layout.nbytes, np.uint8)
        layout.bind(expected).pack_checked(sample)
    except EmulationError:
        with pytest.raises(EmulationError):
            layout.pack(sample, out=rows[0])
        assert not rows.any()
    else:
        assert layout.pack(sample, out=rows[0]).tobytes() == expected.tobytes()


def test_bad_calls_raise_instead_of_writing_anywhere(monkeypatch):
    layout, spec, order = fast_parts(monkeypatch)
    leaves = leaves_of(good(), order)
    rows = np.zeros((2, layout.nbytes), np.uint8)
    with pytest.raises(IndexError, match="row 2 of 2"):
        _fastpack.pack(spec, rows, 2, *leaves)
    with pytest.raises(IndexError):
        _fastpack.pack(spec, rows, -1, *leaves)
    with pytest.raises(TypeError, match="takes 4 leaves, got 3"):
        _fastpack.pack(spec, rows, 0, *leaves[:3])
    for wrong in (np.zeros((2, layout.nbytes + 1), np.uint8), np.zeros((2, layout.nbytes), np.int8),
                  np.zeros((layout.nbytes, 2), np.uint8).T, np.zeros(layout.nbytes, np.uint8)):
        with pytest.raises(ValueError, match="writable C-contiguous"):
            _fastpack.pack(spec, wrong, 0, *leaves)
    read_only = rows.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _fastpack.pack(spec, read_only, 0, *leaves)
    with pytest.raises(ValueError, match="PyCapsule"):
        _fastpack.pack("not a spec", rows, 0, *leaves)
    assert not rows.any()


@pytest.mark.parametrize("leaf, message", [
    (("i", 2, (3, 4), 20, None, None, None, False), "does not fit in the row"),
    (("i", 3, (2,), 0, None, None, None, False), "itemsize of 1, 2, 4 or 8"),
    (("c", 8, (2,), 0, None, None, None, False), "one of 'biuf'"),
    (("f", 4, (2,), 0, 0, 1, None, False), "only integer leaves have bounds"),
    (("i", 8, None, 0, None, None, None, True), "NumPy scalar class"),
    (("i", 4, None, 0, None, None, np.int32, True), "only an int64 scalar leaf takes Python ints"),
    (("i", 4, None, 0, None, None, np.int64, False), "class must have the leaf's dtype"),
    (("u", 2, (2,), 0, np.zeros(3, np.uint16), np.ones(3, np.uint16), None, False), "dtype and size"),
])
def test_a_malformed_spec_is_refused_when_it_is_made(leaf, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _fastpack.make_spec(24, (), (leaf,))
    with pytest.raises(ValueError, match="gap outside the row"):
        _fastpack.make_spec(24, ((20, 30),), ())


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
