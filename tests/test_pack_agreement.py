"""pack and pack_batch accept and refuse exactly the same samples (hypothesis, on the Python path
alone and with the compiled pack), and malformed inputs raise packrl's own errors: ragged and object batches,
huge stride-0 arrays, read-only ``out`` buffers, torch rows misaligned by a byte."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st
from pack_engines import ENGINES, engine, use_engine

from packrl import EmulationError, NativizeError
from packrl.emulation import Layout
from packrl.nativize import nativize

SPACE = spaces.Dict({
    "i": spaces.Box(-3, 9, (2,), np.int16),
    "u": spaces.Box(0, 2**64 - 1, (2,), np.uint64),
    "f": spaces.Box(-1, 1, (2,), np.float32),
    "b": spaces.Box(0, 1, (2,), bool),
    "d": spaces.Discrete(4, start=-1),
    "m": spaces.MultiDiscrete([3, 5]),
})
GOOD = {"i": np.array([0, 9], np.int16), "u": np.array([0, 2**64 - 1], np.uint64), "f": np.zeros(2, np.float32),
        "b": np.array([True, False]), "d": 2, "m": np.array([2, 4])}

# values for two-element leaves: good, convertible, out of range, lossy, malformed
PAIRS = [[0, 1], [1.0, 2.0], [1.5, 0], [-4, 0], [10, 0], [2**63, 1], [2**64, 0], [-1, 0], [True, False], [0, 2],
         [None, 1], ["1", "2"], [[1, 2], [3]], [1, [2]], [np.nan, 0], [np.inf, 0], [1e300, 0], [0.1, 0]]
DTYPES = [None, np.int8, np.int16, np.int64, np.uint8, np.uint64, np.float32, np.float64, bool, object]


def as_value(pair, dtype, form):
    if form == "list":
        return pair
    try:
        arr = np.array(pair, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        return pair
    if form == "strided" and arr.ndim == 1:
        return np.repeat(arr, 2)[::2]
    if form == "2-d":
        return arr.reshape(1, -1)
    return arr


values = st.builds(as_value, st.sampled_from(PAIRS), st.sampled_from(DTYPES),
                   st.sampled_from(["list", "array", "strided", "2-d"]))
scalars = st.sampled_from([0, 2, -1, 3, 4, -2, 2.0, 2.5, True, np.int64(1), np.int8(2), np.uint64(2), np.float32(1),
                           np.array(1), np.array([1]), "1", None, 2**70, np.array(2, dtype=object)])
samples = st.fixed_dictionaries({k: (scalars if k == "d" else values) for k in SPACE.spaces})


def outcome(fn):
    try:
        return fn().tobytes()
    except EmulationError:
        return "refused"


@pytest.mark.parametrize("name", ENGINES)
@given(mutated=st.sets(st.sampled_from(list(SPACE.spaces)), max_size=6), sample=samples)
def test_pack_and_pack_batch_agree(name, mutated, sample):
    """A sample with some leaves replaced by drawn values: refused by both, or the same bytes; and
    the same outcome with the compiled pack as on the Python path alone."""
    layout = LAYOUTS[name]
    sample = {k: (v if k in mutated else GOOD[k]) for k, v in sample.items()}
    one = outcome(lambda: layout.pack(sample))
    alone = outcome(lambda: layout.pack_batch([sample]))
    second = outcome(lambda: layout.pack_batch([GOOD, sample]))
    assert alone == one
    assert second == "refused" if one == "refused" else second == layout.pack(GOOD).tobytes() + one
    row = np.zeros(layout.nbytes, np.uint8)
    assert outcome(lambda: layout.bind(row).pack(sample) or row) == one
    assert outcome(lambda: LAYOUTS["python"].pack(sample)) == one


def _layout(name: str) -> Layout:
    with engine(name):
        return Layout.from_space(SPACE)


LAYOUTS = {name: _layout(name) for name in ENGINES}


def test_ragged_and_object_batches_name_the_sample_and_leaf():
    layout = Layout.from_space(SPACE)
    with pytest.raises(EmulationError, match=r"sample 1: leaf \['m'\]"):
        layout.pack_batch([GOOD, {**GOOD, "m": [[1, 2], [3]]}])
    with pytest.raises(EmulationError, match=r"sample 1: leaf \['m'\]"):
        layout.pack_batch([GOOD, {**GOOD, "m": [1, 2, 3]}])
    objects = {**GOOD, "i": np.array([1, 2], dtype=object)}
    with pytest.raises(EmulationError, match="dtype object"):
        layout.pack(objects)
    with pytest.raises(EmulationError, match=r"sample 0: leaf \['i'\].*dtype object"):
        layout.pack_batch([objects])


def test_huge_stride_0_array_is_refused_without_copying_it():
    layout = Layout.from_space(SPACE)
    huge = np.broadcast_to(np.float32(0), (10**10,))  # 40 GB if it were copied
    with pytest.raises(EmulationError, match=r"leaf \['f'\]: shape \(10000000000,\)"):
        layout.pack({**GOOD, "f": huge})
    with pytest.raises(EmulationError, match=r"sample 0: leaf \['f'\]: shape \(10000000000,\)"):
        layout.pack_batch([{**GOOD, "f": huge}])


@pytest.mark.parametrize("name", ENGINES)
def test_read_only_out_is_refused_naming_it(name, monkeypatch):
    use_engine(name, monkeypatch)
    layout = Layout.from_space(SPACE)
    row = np.zeros(layout.nbytes, np.uint8)
    row.flags.writeable = False
    with pytest.raises(EmulationError, match="pack: out is a read-only array"):
        layout.pack(GOOD, out=row)
    with pytest.raises(EmulationError, match="read-only"):
        layout.bind(row).pack(GOOD)
    rows = np.zeros((2, layout.nbytes), np.uint8)
    rows.flags.writeable = False
    with pytest.raises(EmulationError, match="pack_batch: out is a read-only array"):
        layout.pack_batch([GOOD, GOOD], out=rows)
    assert layout.unpack(rows)["d"].tolist() == [0, 0]  # unpacking read-only rows is fine


def test_torch_rows_misaligned_by_a_byte_raise_nativize_error():
    layout = Layout.from_space(SPACE)
    packed = torch.from_numpy(layout.pack_batch([GOOD] * 3))
    wide = torch.zeros(3, layout.nbytes + 1, dtype=torch.uint8)
    wide[:, 1:] = packed
    with pytest.raises(NativizeError, match=f"multiple of {layout.alignment}"):
        nativize(wide[:, 1:], layout)
    flat = torch.zeros(3 * layout.nbytes + 1, dtype=torch.uint8)
    flat[1:] = packed.reshape(-1)
    with pytest.raises(NativizeError, match="storage offset 1"):
        nativize(flat[1:].view(3, layout.nbytes), layout)
    leaves = nativize(wide[:, 1:].contiguous(), layout)  # the fix the message gives
    assert leaves["u"][0].tolist() == [0, 2**64 - 1] and leaves["d"].tolist() == [2, 2, 2]
    numpy_leaves = nativize(wide[:, 1:].numpy(), layout)  # numpy reads misaligned rows itself
    assert numpy_leaves["u"][0].tolist() == [0, 2**64 - 1]
