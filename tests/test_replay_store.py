"""Replay save/load: a loaded buffer samples exactly what the saved one would (RNG state included), keeps doing
so as both go on, and a changed or malformed file is refused before any array is used."""
import json

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from packrl.checkpoint import CheckpointError
from packrl.emulation import Layout
from packrl.train.replay import ReplayBuffer
from packrl.train.replay_store import ARRAYS, METADATA, STATE
from tests.replay_streams import GAMMA, add, stream


def _same_batch(a, b):
    for field in ("observations", "actions", "returns", "discounts", "next_observations", "weights", "steps", "rows",
                  "indices", "stamps"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


@given(st.integers(0, 2**31), st.integers(1, 4), st.integers(1, 30), st.integers(2, 12), st.integers(1, 3),
       st.sampled_from([0.0, 0.3]), st.sampled_from([0.0, 0.25]), st.booleans())
def test_load_restores_sampling_exactly(tmp_path_factory, seed, rows, steps, capacity, n, p_end, p_mask, prioritized):
    rng = np.random.default_rng(seed)
    events = stream(rng, 2 * steps, rows, p_end, p_mask)
    buf = ReplayBuffer(capacity, rows, (), np.int64, gamma=GAMMA, seed=seed, prioritized=prioritized, alpha=0.7, beta=0.5)
    for event in events[:steps]:
        add(buf, event)
    if buf.transitions and prioritized:
        batch = buf.sample(8, n)
        buf.update_priorities(batch, rng.exponential(size=8))
    path = buf.save(tmp_path_factory.mktemp("replay") / "buffer")
    loaded = ReplayBuffer.load(path)
    for name in STATE:
        assert np.array_equal(getattr(loaded, name), getattr(buf, name)), name
    assert loaded.rng.bit_generator.state == buf.rng.bit_generator.state
    for event in events[steps:]:  # both go on alike: the same adds, the same draws, the same priorities
        add(buf, event)
        add(loaded, event)
        if buf.transitions:
            a, b = buf.sample(8, n), loaded.sample(8, n)
            _same_batch(a, b)
            if prioritized:
                new = rng.exponential(size=8)
                assert buf.update_priorities(a, new) == loaded.update_priorities(b, new)


def _dict_buffer(tmp_path):
    space = spaces.Dict({"image": spaces.Box(0, 255, (3, 3), np.uint8), "pos": spaces.Box(-1, 1, (2,), np.float64),
                         "dir": spaces.Discrete(4, start=1)})
    layout = Layout.from_space(space)
    buf = ReplayBuffer(8, 2, layout=layout, gamma=GAMMA, seed=0, prioritized=True)
    space.seed(0)
    for t in range(10):
        obs = np.stack([layout.pack(space.sample()) for _ in range(2)])
        buf.add(obs, np.array([t, t]), np.ones(2, np.float32), np.array([t == 4, False]), np.zeros(2, bool), obs)
    return buf, buf.save(tmp_path / "buffer")


def test_layout_travels_and_samples_come_back_nativized(tmp_path):
    buf, path = _dict_buffer(tmp_path)
    loaded = ReplayBuffer.load(path)
    assert loaded.layout == buf.layout
    a, b = buf.sample(16, 3, device="cpu"), loaded.sample(16, 3, device="cpu")
    for key in ("image", "pos", "dir"):
        assert a.observations[key].dtype == b.observations[key].dtype
        assert torch.equal(a.observations[key], b.observations[key])
        assert torch.equal(a.next_observations[key], b.next_observations[key])
    assert b.observations["pos"].dtype == torch.float64 and b.observations["image"].shape == (16, 3, 3)


def test_files_are_safetensors_and_json_only(tmp_path):
    _, path = _dict_buffer(tmp_path)
    assert sorted(p.name for p in path.iterdir()) == sorted([ARRAYS, METADATA])
    metadata = json.loads((path / METADATA).read_text())
    assert metadata["format"] == "packrl.replay/1" and len(metadata["sha256"]) == 64
    data = (path / ARRAYS).read_bytes()  # safetensors: an 8-byte header length, a JSON header, raw bytes
    header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
    assert set(header) - {"__metadata__"} == set(STATE)


def test_a_changed_array_file_is_refused_by_its_hash(tmp_path):
    _, path = _dict_buffer(tmp_path)
    data = bytearray((path / ARRAYS).read_bytes())
    data[-1] ^= 0xFF
    (path / ARRAYS).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256 .* does not match"):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("field, value, words", [
    ("observation_dtype", "object", "field 'observation_dtype' must be a numeric dtype"),
    ("action_dtype", "numpy.core.multiarray._reconstruct", "field 'action_dtype' must be a numeric dtype"),
    ("rng", {"bit_generator": "os.system", "state": {}}, "field 'rng' names bit generator 'os.system'"),
    ("capacity", "8", "field 'capacity' is missing or not a int"),
    ("capacity", 9, "array 'observations' is"),
    ("format", "packrl.checkpoint/1", "format 'packrl.checkpoint/1', expected 'packrl.replay/1'"),
    ("layout", {"format": "packrl.layout/1"}, "field 'layout' is not a packrl layout"),
])
def test_malformed_metadata_is_refused_naming_the_field(tmp_path, field, value, words):
    _, path = _dict_buffer(tmp_path)
    metadata = json.loads((path / METADATA).read_text())
    metadata[field] = value
    (path / METADATA).write_text(json.dumps(metadata))
    with pytest.raises(CheckpointError, match=words):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("name, index, value", [("starts", 0, 10**9), ("ptr", 1, -1), ("where", 3, 7), ("sums", -1, 3.0),
                                               ("mins", 1, 0.5)])
def test_an_index_pointing_outside_the_buffer_is_refused(tmp_path, name, index, value):
    """The hash only proves the file is the one the metadata names; the index arrays Numba reads unchecked are
    checked too, so a crafted pair of files cannot make the sampler read outside the storage."""
    from safetensors.numpy import load_file, save_file

    from packrl.checkpoint import sha256_file

    _, path = _dict_buffer(tmp_path)
    arrays = load_file(str(path / ARRAYS))
    arrays[name][index] = value
    save_file(arrays, str(path / ARRAYS))
    metadata = json.loads((path / METADATA).read_text())
    metadata["sha256"] = sha256_file(path / ARRAYS)
    (path / METADATA).write_text(json.dumps(metadata))
    with pytest.raises(CheckpointError, match=f"array '{'sums' if name == 'mins' else name}' is inconsistent"):
        ReplayBuffer.load(path)


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="no replay.json"):
        ReplayBuffer.load(tmp_path / "nowhere")
