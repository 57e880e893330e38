"""Bool Box leaves: bounds checked and bytes always 0 or 1, on every pack path (the checked Python
path, the compiled pack, strided leaves, pack_batch of a list and of a batched structure, bound
rows): a bool array holding byte 2 is refused, never stored."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from pack_engines import ENGINES, use_engine

from packrl import EmulationError
from packrl.emulation import Layout

SPACE = spaces.Dict({
    "pinned": spaces.Box(low=np.array([0, 1]), high=np.array([1, 1]), dtype=bool),  # element 1 must be True
    "free": spaces.Box(0, 1, (3,), bool),
    "scalar": spaces.Box(0, 1, (), bool),
    "x": spaces.Box(-1, 1, (2,), np.float32),
})


def good():
    return {"pinned": np.array([False, True]), "free": np.array([True, False, True]), "scalar": np.True_,
            "x": np.zeros(2, np.float32)}


def noncanonical(values):
    return np.array(values, np.uint8).view(bool)


def strided(values):
    return np.repeat(np.asarray(values, bool), 2)[::2]


BAD = {
    "pinned element 1 False": {"pinned": np.array([True, False])},
    "pinned as a list": {"pinned": [True, False]},
    "pinned strided": {"pinned": strided([False, False])},
    "byte 2": {"free": noncanonical([2, 0, 1])},
    "byte 255 in pinned": {"pinned": noncanonical([0, 255])},
    "byte 2 strided": {"free": np.array([2, 9, 0, 9, 1, 9], np.uint8).view(bool)[::2]},
    "0-d byte 3": {"scalar": noncanonical(3)},
    "uint8 array with a 2": {"free": np.array([0, 2, 1], np.uint8)},
}

@pytest.fixture(params=ENGINES)
def layout(request, monkeypatch):
    use_engine(request.param, monkeypatch)
    return Layout.from_space(SPACE)


def pack_ways(layout, sample):
    """The row of ``sample`` packed every way there is; each must agree."""
    row = np.full(layout.nbytes, 7, np.uint8)
    bound = layout.bind(np.full(layout.nbytes, 7, np.uint8))
    for _ in range(2):
        bound.pack(sample)
    return [layout.pack(sample), layout.pack(sample, out=row), bound.rows,
            layout.pack_batch([sample, sample])[1],
            layout.pack_batch({k: np.stack([np.asarray(v)] * 2) for k, v in sample.items()})[0]]


@pytest.mark.parametrize("case", list(BAD))
def test_refused_on_every_path(layout, case):
    sample = {**good(), **BAD[case]}
    row = np.full(layout.nbytes, 7, np.uint8)
    with pytest.raises(EmulationError, match="non-canonical bool|bounds|0 or 1"):
        layout.pack(sample, out=row)
    assert (row == 7).all()  # nothing written
    with pytest.raises(EmulationError):
        layout.pack(sample)
    with pytest.raises(EmulationError):
        layout.bind(row).pack(sample)
    with pytest.raises(EmulationError):
        layout.pack_batch([good(), sample])
    batched = {k: np.stack([np.asarray(good()[k]), np.asarray(v)]) for k, v in sample.items()}
    with pytest.raises(EmulationError):
        layout.pack_batch(batched)


def test_good_bools_pack_alike_on_every_path(layout):
    for sample in (good(), {**good(), "free": strided([0, 1, 1]), "pinned": [True, True], "scalar": False},
                   {**good(), "free": np.array([1, 0, 1], np.uint8)}):  # an exact uint8 0/1 is taken
        rows = pack_ways(layout, sample)
        for row in rows[1:]:
            assert np.array_equal(row, rows[0])
        unpacked = layout.unpack(rows[0])
        for key in ("pinned", "free", "scalar"):
            assert np.array_equal(unpacked[key], np.asarray(sample[key], bool))
            assert set(np.asarray(unpacked[key]).view(np.uint8).reshape(-1).tolist()) <= {0, 1}


def test_the_compiled_pack_takes_good_bools_itself():
    """The compiled pack checks bool leaves itself (not only by falling back): a good sample is
    taken, a bad one is refused, by the compiled pack alone."""
    layout = Layout.from_space(SPACE)
    compiled = layout.compiled_pack()
    rows = np.zeros((1, layout.nbytes), np.uint8)
    assert compiled.pack(good(), rows, 0)
    assert compiled.pack({**good(), "free": strided([1, 0, 1])}, rows, 0)  # strided: gathered
    assert compiled.pack({**good(), "scalar": np.False_}, rows, 0)  # a NumPy bool scalar
    for case in ("pinned element 1 False", "byte 2", "byte 2 strided", "0-d byte 3", "pinned strided"):
        assert not compiled.pack({**good(), **BAD[case]}, rows, 0), case
    assert layout.unpack(rows[0])["scalar"] == np.False_, "a refused sample writes nothing"
