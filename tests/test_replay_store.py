"""Replay save/load: a loaded buffer samples exactly what the saved one would (RNG state included), keeps doing
so as both go on, and a changed or malformed file is refused before any array is used."""
import json

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packrl.checkpoint import CheckpointError
from packrl.emulation import Layout
from packrl.errors import UsageError
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


def _dict_buffer(tmp_path, frame_stack=1):
    space = spaces.Dict({"image": spaces.Box(0, 255, (3, 3), np.uint8), "pos": spaces.Box(-1, 1, (2,), np.float64),
                         "dir": spaces.Discrete(4, start=1)})
    layout = Layout.from_space(space)
    buf = ReplayBuffer(8, 2, layout=layout, gamma=GAMMA, seed=0, prioritized=True, frame_stack=frame_stack,
                       frame_stack_leaf="image" if frame_stack > 1 else None)
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
    assert metadata["format"] == "packrl.replay/2" and len(metadata["sha256"]) == 64
    data = (path / ARRAYS).read_bytes()  # safetensors: an 8-byte header length, a JSON header, raw bytes
    header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
    assert set(header) - {"__metadata__"} == set(STATE)


def test_a_changed_array_file_is_refused_by_its_hash(tmp_path):
    _, path = _dict_buffer(tmp_path)
    data = bytearray((path / ARRAYS).read_bytes())
    data[-1] ^= 0xFF
    (path / ARRAYS).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256 .* does not match replay.json's arrays_sha256"):
        ReplayBuffer.load(path)


def _resign(path, metadata=None):
    """Rewrite replay.json with both hashes recomputed, as a tool that edits the files knowingly would: what
    is left to refuse a malformed file is the checks behind the hash."""
    from packrl.checkpoint import manifest_sha256, sha256_file

    metadata = json.loads((path / METADATA).read_text()) if metadata is None else metadata
    metadata["arrays_sha256"] = sha256_file(path / ARRAYS)
    metadata["sha256"] = manifest_sha256(metadata)
    (path / METADATA).write_text(json.dumps(metadata))


@pytest.mark.parametrize("field, value, words", [
    ("observation_dtype", "object", "field 'observation_dtype' must be a numeric dtype"),
    ("action_dtype", "numpy.core.multiarray._reconstruct", "field 'action_dtype' must be a numeric dtype"),
    ("rng", {"bit_generator": "os.system", "state": {}}, "field 'rng' names bit generator 'os.system'"),
    ("rng", {"bit_generator": ["PCG64"]}, "field 'rng' names bit generator \\['PCG64'\\]"),
    ("rng", {"bit_generator": "PCG64", "state": {"state": "x", "inc": 1}}, "field 'rng' is not a PCG64 state"),
    ("capacity", "8", "field 'capacity' is missing or not a int"),
    ("capacity", 9, "array 'observations' is U8 \\[8, 2, 40\\], the metadata makes it U8 \\[9, 2, 40\\]"),
    ("capacity", 10**30, "array 'observations' is U8"),
    ("capacity", 0, "field 'capacity' must be > 0"),
    ("num_rows", True, "field 'num_rows' is missing or not a int"),
    ("observation_shape", [8, -1], "field 'observation_shape' must be a list of non-negative ints"),
    ("observation_dtype", "<f4", "array 'observations' is U8 \\[8, 2, 40\\], the metadata makes it F32"),
    ("action_dtype", "<f2", "array 'actions' is I64 \\[8, 2\\], the metadata makes it F16"),
    ("format", "packrl.checkpoint/1", "format 'packrl.checkpoint/1', expected 'packrl.replay/2'"),
    ("format", "packrl.replay/1", "saved by an older packrl"),
    ("layout", {"format": "packrl.layout/1"}, "field 'layout' is not a packrl layout"),
    ("layout", [1, 2], "field 'layout' must be null or a layout object"),
    ("gamma", 1.5, "ReplayBuffer gamma must be in \\[0, 1\\]"),
    ("gamma", "0.9", "field 'gamma' is missing or not a finite number"),
    ("gamma", 1e400, "not valid JSON \\(Infinity is not a JSON number\\)"),
    ("alpha", -1, "ReplayBuffer alpha must be finite and >= 0"),
    ("beta", None, "field 'beta' is missing or not a finite number"),
    ("priority_eps", 0.0, "priority_eps must be finite and > 0"),
    ("max_priority", -2.0, "field 'max_priority' must be > 0"),
    ("prioritized", 1, "field 'prioritized' is missing or not a bool"),
    ("prioritized", False, "array 'sums' is F64 \\[32\\], the metadata makes it F64 \\[0\\]"),
    ("frame_stack", 2.0, "field 'frame_stack' is missing or not a int"),
    ("frame_stack", 3, "frame_stack_leaf must name the leaf to stack"),
    ("frame_stack_leaf", "['nowhere']", "frame_stack_leaf=\"\\['nowhere'\\]\" is not a leaf of the layout"),
    ("frame_stack_leaf", {"a": 1}, "field 'frame_stack_leaf' must be null or a leaf name"),
    ("arrays_sha256", "0" * 64, "SHA-256 [0-9a-f]{64} does not match replay.json's arrays_sha256 0{64}"),
])
def test_malformed_metadata_is_refused_naming_the_field(tmp_path, field, value, words):
    """Each field with its hashes recomputed (so the check behind the hash is what refuses it)."""
    _, path = _dict_buffer(tmp_path)
    metadata = json.loads((path / METADATA).read_text())
    metadata[field] = value
    _resign(path, metadata)
    if field == "arrays_sha256":  # _resign recomputed it: write the wrong one back under a valid manifest
        from packrl.checkpoint import manifest_sha256

        metadata["arrays_sha256"] = value
        metadata["sha256"] = manifest_sha256(metadata)
        (path / METADATA).write_text(json.dumps(metadata))
    with pytest.raises(CheckpointError, match=words) as caught:
        ReplayBuffer.load(path)
    assert "\n" not in str(caught.value)


SAVED_FIELDS = {"format", "sha256", "arrays_sha256", "capacity", "num_rows", "observation_shape", "observation_dtype",
                "action_shape", "action_dtype", "gamma", "layout", "prioritized", "alpha", "beta", "priority_eps",
                "max_priority", "frame_stack", "frame_stack_leaf", "rng", "created"}


def _edits(value):
    """Small edits of a JSON value that keep its type where it has one: what a hand edit does."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, float)):
        return [value + 1, value * 0.5 if value else 0.25]
    if isinstance(value, str):
        return [value + "x", value[:-1]]
    if value is None:
        return [0]
    if isinstance(value, list):
        return [value + [1], value[:-1]] if value else [[1]]
    if isinstance(value, dict):
        key = sorted(value)[0]
        return [{**value, key: edit} for edit in _edits(value[key])[:1]] + [{**value, "extra": 1}]
    raise AssertionError(value)


def test_every_saved_field_is_under_the_hash(tmp_path):
    """Each field of replay.json, edited alone (hashes not recomputed), is refused: gamma, the priority settings,
    the RNG state and the frame stack change what a loaded buffer samples, and none may change silently."""
    buf, path = _dict_buffer(tmp_path, frame_stack=2)
    original = json.loads((path / METADATA).read_text())
    assert set(original) == SAVED_FIELDS, "a new saved field needs a row here"
    for field in sorted(SAVED_FIELDS):
        for edit in _edits(original[field]):
            (path / METADATA).write_text(json.dumps({**original, field: edit}))
            words = "format" if field == "format" else "field 'sha256' .* does not match the manifest hash"
            with pytest.raises(CheckpointError, match=words):
                ReplayBuffer.load(path)
    (path / METADATA).write_text(json.dumps(original))
    assert ReplayBuffer.load(path).gamma == buf.gamma  # and the untouched file still loads


def test_every_saved_array_is_under_the_hash(tmp_path):
    """One byte changed inside each array's own bytes of replay.safetensors is refused."""
    from packrl.checkpoint import read_header

    _, path = _dict_buffer(tmp_path)
    tensors, _ = read_header(path / ARRAYS)
    assert set(tensors) == set(STATE)
    original = (path / ARRAYS).read_bytes()
    data_start = 8 + int.from_bytes(original[:8], "little")
    for name in STATE:
        if tensors[name].nbytes == 0:
            continue
        data = bytearray(original)
        data[data_start + tensors[name].start] ^= 0x01
        (path / ARRAYS).write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match="arrays_sha256"):
            ReplayBuffer.load(path)
    (path / ARRAYS).write_bytes(original)
    ReplayBuffer.load(path)


def test_a_pickle_in_place_of_the_arrays_is_refused_as_a_checkpoint_error(tmp_path):
    import pickle

    _, path = _dict_buffer(tmp_path)
    (path / ARRAYS).write_bytes(pickle.dumps({"observations": np.zeros(3)}))
    with pytest.raises(CheckpointError, match="arrays_sha256"):  # as saved: the hash refuses it
        ReplayBuffer.load(path)
    _resign(path)  # with the hashes made to match: the header check refuses it, never a raw SafetensorError
    with pytest.raises(CheckpointError, match="replay.safetensors: not a safetensors file"):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("keep", [0, 7, 8, 100, -1])
def test_a_truncated_array_file_is_refused(tmp_path, keep):
    _, path = _dict_buffer(tmp_path)
    data = (path / ARRAYS).read_bytes()
    (path / ARRAYS).write_bytes(data[:keep])
    _resign(path)
    with pytest.raises(CheckpointError, match="replay.safetensors: (not a safetensors file|tensor .* outside)"):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("change, words", [
    (lambda a: a.update(observations=a["observations"][:, :1]), "array 'observations' is U8 \\[8, 1, 40\\]"),
    (lambda a: a.update(rewards=a["rewards"].astype(np.float64)), "array 'rewards' is F64"),
    (lambda a: a.pop("where"), "array 'where' is missing"),
    (lambda a: a.update(extra=np.zeros(3)), "array 'extra' is not one a replay buffer holds"),
    (lambda a: a.update(sums=a["sums"][:-2]), "array 'sums' is F64 \\[30\\]"),
])
def test_arrays_of_the_wrong_shape_dtype_or_name_are_refused(tmp_path, change, words):
    from safetensors.numpy import load_file, save_file

    _, path = _dict_buffer(tmp_path)
    arrays = load_file(str(path / ARRAYS))
    change(arrays)
    save_file(arrays, str(path / ARRAYS))
    _resign(path)
    with pytest.raises(CheckpointError, match=words):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ('{"format": "packrl.replay/2", "gamma": NaN}', "not valid JSON \\(NaN is not a JSON number\\)"),
    ("\udcff", "not valid JSON"),
    ("[1, 2]", "format 'list', expected"),
    ('{"format": "packrl.replay/2"}', "field 'sha256' is missing"),
    ('{"format": {"a": [1]}}', "format {'a': \\[1\\]}, expected"),
])
def test_hostile_json_is_refused(tmp_path, text, words):
    _, path = _dict_buffer(tmp_path)
    (path / METADATA).write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(CheckpointError, match=words) as caught:
        ReplayBuffer.load(path)
    assert "\n" not in str(caught.value)


def _mutate(value, draw):
    """A random replacement somewhere inside a JSON value."""
    hostile = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                        st.text(max_size=5), st.lists(st.integers(-3, 3), max_size=3),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        return {**value, key: _mutate(value[key], draw)}
    if isinstance(value, list) and value and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        return value[:i] + [_mutate(value[i], draw)] + value[i + 1:]
    return draw(hostile)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_resigned_metadata_edit_loads_or_is_a_checkpoint_error(tmp_path, data):
    """Fuzz: one random value anywhere in replay.json, hashes recomputed. The load either succeeds with a buffer
    that samples, or raises CheckpointError; never another exception."""
    buf, path = _dict_buffer(tmp_path / str(data.draw(st.integers(0, 10**9))), frame_stack=2)
    metadata = json.loads((path / METADATA).read_text())
    field = data.draw(st.sampled_from(sorted(SAVED_FIELDS - {"sha256", "arrays_sha256", "format"})))
    metadata[field] = _mutate(metadata[field], data.draw)
    _resign(path, metadata)
    try:
        loaded = ReplayBuffer.load(path)
    except CheckpointError as err:
        assert "\n" not in str(err)
        return
    loaded.sample(4, 2)
    loaded.sample_sequences(2, 3)


@pytest.mark.parametrize("name, index, value", [("starts", 0, 10**9), ("ptr", 1, -1), ("where", 3, 7), ("sums", -1, 3.0),
                                               ("mins", 1, 0.5), ("count", 0, 9), ("held", 0, 17)])
def test_an_index_pointing_outside_the_buffer_is_refused(tmp_path, name, index, value):
    """The hash only proves the files are the ones saved together; the index arrays Numba reads unchecked are
    checked too, so a crafted pair of files cannot make the sampler read outside the storage."""
    from safetensors.numpy import load_file, save_file

    _, path = _dict_buffer(tmp_path)
    arrays = load_file(str(path / ARRAYS))
    arrays[name][index] = value
    save_file(arrays, str(path / ARRAYS))
    _resign(path)
    with pytest.raises(CheckpointError, match=f"array '{'sums' if name == 'mins' else name}' is inconsistent"):
        ReplayBuffer.load(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_resigned_byte_change_of_the_arrays_loads_or_is_a_checkpoint_error(tmp_path, data):
    """Fuzz: bytes of replay.safetensors changed anywhere (header or data), hashes recomputed. The load either
    succeeds with a buffer whose index is sound (it samples, stacks and sequences without reading outside
    the storage) or raises CheckpointError; never another exception."""
    _, path = _dict_buffer(tmp_path / str(data.draw(st.integers(0, 10**9))), frame_stack=2)
    raw = bytearray((path / ARRAYS).read_bytes())
    header_end = 8 + int.from_bytes(raw[:8], "little")
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.one_of(st.integers(0, header_end - 1), st.integers(0, len(raw) - 1)))
        raw[where] = data.draw(st.integers(0, 255))
    (path / ARRAYS).write_bytes(bytes(raw))
    _resign(path)
    try:
        loaded = ReplayBuffer.load(path)
    except CheckpointError as err:
        assert "\n" not in str(err)
        return
    if loaded.transitions:
        loaded.sample(8, 3)
        loaded.sample_sequences(4, 5)


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="no replay.json"):
        ReplayBuffer.load(tmp_path / "nowhere")


def test_a_frame_stack_beyond_the_capacity_is_refused(tmp_path):
    """Found by the fuzz above: a re-signed frame_stack of 493,374,223 loaded, and the first sample asked for
    33 GiB. A stack holds at most MAX_FRAME_STACK (1024) frames: the load refuses more, as the constructor does."""
    buf, path = _dict_buffer(tmp_path, frame_stack=2)
    metadata = json.loads((path / METADATA).read_text())
    _resign(path, {**metadata, "frame_stack": 493_374_223})
    with pytest.raises(CheckpointError, match="frame_stack=493374223 is more than 1024 frames"):
        ReplayBuffer.load(path)
    with pytest.raises(UsageError, match="frame_stack=1025 is more than 1024 frames"):
        ReplayBuffer(8, 1, (4,), np.uint8, frame_stack=1025)
