"""Frame stacks built at sample time and sequence sampling, against straightforward references rebuilt from the
raw step stream (plain Python lists, no shared code with the buffer): a stack never holds a frame of another
episode (the places before an episode's first frame repeat it), and a sequence's masks stop at every episode
end and at the row's newest slot."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from packrl.emulation import Layout
from packrl.errors import UsageError
from packrl.train.replay import ReplayBuffer
from tests.replay_streams import GAMMA, add, check_nstep, reference_slots, stream


def reference_history(events, rows, capacity):
    """Per row: every slot ever written, oldest first, as (obs id, reward, discount, last, episode number), and
    the index of the oldest slot still held."""
    history = [[] for _ in range(rows)]
    episode = [0] * rows
    for obs, rewards, term, trunc, final, masks in events:
        for r in np.flatnonzero(masks):
            history[r].append((int(obs[r]), float(rewards[r]), 0.0 if term[r] else GAMMA, False, episode[r]))
            if term[r] or trunc[r]:
                history[r].append((int(final[r]), 0.0, 0.0, True, episode[r]))
                episode[r] += 1
    return history, [max(0, len(h) - capacity) for h in history]


def reference_stack(history, oldest, j, k):
    """The k frames ending at slot j: slots j-k+1..j, each clamped to the episode's first slot still held."""
    first = j
    while first > oldest and history[first - 1][4] == history[j][4]:
        first -= 1
    return [history[max(i, first)][0] for i in range(j - k + 1, j + 1)]


def position(history, obs_id):
    (j,) = [i for i, slot in enumerate(history) if slot[0] == obs_id]
    return j


STREAMS = dict(seed=st.integers(0, 2**31), rows=st.integers(1, 4), steps=st.integers(1, 40),
               capacity=st.integers(2, 16), p_end=st.sampled_from([0.0, 0.2, 0.6]), p_mask=st.sampled_from([0.0, 0.3]),
               prioritized=st.booleans())


def _filled(seed, rows, steps, capacity, p_end, p_mask, prioritized, **kwargs):
    rng = np.random.default_rng(seed)
    events = stream(rng, steps, rows, p_end, p_mask)
    buf = ReplayBuffer(capacity, rows, (), np.int64, gamma=GAMMA, seed=seed, prioritized=prioritized, **kwargs)
    for event in events:
        add(buf, event)
    return buf, events


@settings(deadline=None)
@given(k=st.integers(1, 5), n=st.integers(1, 4), **STREAMS)
def test_frame_stacks_match_the_reference_and_never_cross_an_episode_start(seed, rows, steps, capacity, p_end,
                                                                          p_mask, prioritized, k, n):
    buf, events = _filled(seed, rows, steps, capacity, p_end, p_mask, prioritized, frame_stack=k)
    if not buf.transitions:
        return
    batch = buf.sample(64, n)
    assert batch.observations.shape == batch.next_observations.shape == ((64, k) if k > 1 else (64,))
    if k == 1:  # no stack: the plain shape, read here as stacks of one
        batch.observations, batch.next_observations = batch.observations[:, None], batch.next_observations[:, None]
    history, oldest = reference_history(events, rows, capacity)
    for i in range(64):
        h, lo = history[batch.rows[i]], oldest[batch.rows[i]]
        for stack in (batch.observations[i], batch.next_observations[i]):
            j = position(h, stack[-1])
            assert list(stack) == reference_stack(h, lo, j, k)
            assert len({h[position(h, f)][4] for f in stack}) == 1, "one episode per stack"
    # the n-step part is the unstacked buffer's: checked on the current frames
    current = SimpleNamespace(**{**vars(batch), "observations": batch.observations[:, -1],
                                 "next_observations": batch.next_observations[:, -1]})
    check_nstep(current, reference_slots(events, rows, capacity), n, rows)


def reference_sequence(history, j, length):
    """From slot j: observations (length + 1), steps (obs id as the action), rewards, discounts, masks."""
    observations, actions, rewards, discounts, masks = [history[j][0]], [], [], [], []
    alive = True
    for t in range(length):
        slot = j + t
        alive = alive and not history[slot][3] and slot + 1 < len(history)
        masks.append(alive)
        if alive:
            actions.append(history[slot][0])
            rewards.append(history[slot][1])
            discounts.append(history[slot][2])
            observations.append(history[slot + 1][0])
        else:
            actions.append(actions[-1])
            rewards.append(0.0)
            discounts.append(0.0)
            observations.append(observations[-1])
    return observations, actions, rewards, discounts, masks


@settings(deadline=None)
@given(length=st.integers(1, 8), k=st.integers(1, 3), **STREAMS)
def test_sequences_match_the_reference_with_masks_at_episode_ends(seed, rows, steps, capacity, p_end, p_mask,
                                                                  prioritized, length, k):
    buf, events = _filled(seed, rows, steps, capacity, p_end, p_mask, prioritized, frame_stack=k)
    if length > capacity:  # no real step could fill it
        with pytest.raises(UsageError, match="longer than the buffer"):
            buf.sample_sequences(4, length)
        return
    if not buf.transitions:
        with pytest.raises(UsageError, match="no transition"):
            buf.sample_sequences(4, length)
        return
    batch = buf.sample_sequences(32, length)
    history, oldest = reference_history(events, rows, capacity)
    assert batch.observations.shape == (32, length + 1, k)[:3 if k > 1 else 2] and batch.masks.shape == (32, length)
    if k == 1:
        batch.observations = batch.observations[..., None]
    assert set(batch.indices.tolist()) <= set(buf.starts[:buf.transitions].tolist())
    for i in range(32):
        h, lo = history[batch.rows[i]], oldest[batch.rows[i]]
        j = position(h, batch.observations[i, 0, -1])
        observations, actions, rewards, discounts, masks = reference_sequence(h, j, length)
        assert batch.observations[i, :, -1].tolist() == observations
        assert batch.actions[i].tolist() == actions
        np.testing.assert_array_equal(batch.rewards[i], np.float32(rewards))
        np.testing.assert_array_equal(batch.discounts[i], np.float32(discounts))
        assert batch.masks[i].tolist() == masks
        episodes = {h[position(h, o)][4] for o, real in zip(observations, [True, *masks]) if real}
        assert len(episodes) == 1, "a sequence's real places are one episode"
        for t in range(length + 1):
            assert batch.observations[i, t].tolist() == reference_stack(h, lo, position(h, observations[t]), k)
    if prioritized:
        assert np.all((batch.weights > 0) & (batch.weights <= 1))
    else:
        assert np.all(batch.weights == 1)


def test_the_reference_stack_can_fail():
    """The stack check catches a buffer that stacked across an episode start: the reference differs from the
    naive last-k window exactly there."""
    history = [(0, 0, GAMMA, False, 0), (1, 0, 0, True, 0), (2, 0, GAMMA, False, 1), (3, 0, GAMMA, False, 1)]
    assert reference_stack(history, 0, 2, 3) == [2, 2, 2]
    assert reference_stack(history, 0, 3, 3) == [2, 2, 3]
    assert reference_stack(history, 0, 1, 3) == [0, 0, 1]
    assert reference_stack(history, 1, 1, 3) == [1, 1, 1], "the ring's oldest held frame pads an episode cut by it"
    assert reference_sequence(history, 0, 3)[4] == [True, False, False]


def _pixel_buffer(**kwargs):
    space = spaces.Dict({"pixels": spaces.Box(0, 255, (2, 3, 3), np.uint8), "step": spaces.Box(0, 100, (), np.int32)})
    layout = Layout.from_space(space)
    buf = ReplayBuffer(16, 2, layout=layout, gamma=GAMMA, seed=0, **kwargs)
    for t in range(12):
        obs = np.stack([layout.pack({"pixels": np.full((2, 3, 3), 10 * r + t, np.uint8), "step": np.int32(t)})
                        for r in range(2)])
        buf.add(obs, np.array([t, t]), np.ones(2, np.float32), np.array([t == 5, False]), np.zeros(2, bool), obs)
    return buf


@pytest.mark.parametrize("device", [None, "cpu"])
def test_a_chosen_leaf_is_stacked_and_the_others_are_the_current_frame(device):
    buf = _pixel_buffer(frame_stack=3, frame_stack_leaf="pixels")
    assert buf.frame_stack_leaf == "['pixels']"
    batch = buf.sample(64, 1, device=device)
    pixels, step = batch.observations["pixels"], batch.observations["step"]
    if device is not None:
        assert isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8
        pixels, step = pixels.numpy(), step.numpy()
    assert pixels.shape == (64, 3, 2, 3, 3) and step.shape == (64,)
    for i in range(64):
        frames = pixels[i, :, 0, 0, 0] - 10 * batch.rows[i]  # each frame's step number
        assert frames[-1] == (step[i] if step[i] != 5 or batch.rows[i] else step[i])
        assert np.all(np.diff(frames.astype(int)) >= 0) and np.all(np.diff(frames.astype(int)) <= 1)
    sequences = buf.sample_sequences(8, 4, device=device)
    assert tuple(sequences.observations["pixels"].shape) == (8, 5, 3, 2, 3, 3)
    assert tuple(sequences.observations["step"].shape) == (8, 5)


def test_frame_stack_settings_are_checked():
    with pytest.raises(UsageError, match="frame_stack_leaf must name the leaf to stack, one of"):
        _pixel_buffer(frame_stack=2)
    with pytest.raises(UsageError, match="frame_stack_leaf='pos' is not a leaf of the layout"):
        _pixel_buffer(frame_stack=2, frame_stack_leaf="pos")
    with pytest.raises(UsageError, match="frame_stack must be an int >= 1"):
        _pixel_buffer(frame_stack=0)
    with pytest.raises(UsageError, match="needs observations stored as a layout's rows"):
        ReplayBuffer(8, 1, (3,), np.float32, frame_stack=2, frame_stack_leaf="x")
    with pytest.raises(UsageError, match="sequence_length must be an int >= 1"):
        _pixel_buffer().sample_sequences(4, 0)


def test_frame_stack_and_leaf_travel_through_save_and_load(tmp_path):
    buf = _pixel_buffer(frame_stack=3, frame_stack_leaf=("pixels",))
    loaded = ReplayBuffer.load(buf.save(tmp_path / "buffer"))
    assert (loaded.frame_stack, loaded.frame_stack_leaf) == (3, "['pixels']")
    a, b = buf.sample(16, 2), loaded.sample(16, 2)
    assert np.array_equal(a.observations["pixels"], b.observations["pixels"])
    assert np.array_equal(a.next_observations["pixels"], b.next_observations["pixels"])


def test_each_frame_is_stored_once():
    """Stacking costs no storage: the buffer with frame_stack=4 holds the same bytes as without."""
    assert _pixel_buffer(frame_stack=4, frame_stack_leaf="pixels").nbytes == _pixel_buffer().nbytes


def test_torch_samples_equal_numpy_samples_for_the_same_draw():
    """The torch path (leaf views of tensors, stacks viewed in the leaf's dtype) gives the numpy path's values."""
    buf = _pixel_buffer(frame_stack=3, frame_stack_leaf="pixels")
    state = buf.rng.bit_generator.state
    host = buf.sample_sequences(8, 4)
    buf.rng.bit_generator.state = state
    tensors = buf.sample_sequences(8, 4, device="cpu")
    for key in ("pixels", "step"):
        assert np.array_equal(tensors.observations[key].numpy(), host.observations[key])
    assert np.array_equal(tensors.masks.numpy(), host.masks)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_frame_stacks_and_sequences_equal_the_host_ones():
    buf = _pixel_buffer(frame_stack=3, frame_stack_leaf="pixels")
    for sample in (lambda device: buf.sample(32, 2, device=device), lambda device: buf.sample_sequences(8, 4, device=device)):
        state = buf.rng.bit_generator.state
        host = sample(None)
        buf.rng.bit_generator.state = state
        on_gpu = sample("cuda")
        assert on_gpu.observations["pixels"].device.type == "cuda"
        for key in ("pixels", "step"):
            assert np.array_equal(on_gpu.observations[key].cpu().numpy(), host.observations[key])
        if hasattr(host, "next_observations"):
            assert np.array_equal(on_gpu.next_observations["pixels"].cpu().numpy(), host.next_observations["pixels"])


def test_prioritized_sequences_take_new_priorities_for_their_starts():
    buf = _pixel_buffer(prioritized=True, alpha=1.0)
    batch = buf.sample_sequences(8, 3)
    assert buf.update_priorities(batch, np.full(8, 5.0)) == 0
    p = buf.probabilities().ravel()
    assert np.all(p[batch.indices] == p.max()) and p.max() > p[p > 0].min()
