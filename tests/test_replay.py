"""Replay buffer: n-step samples against a per-row reference built from the raw step stream, the set of
transition starts, uniform sampling, truncation against termination in a real env, and refused input."""
import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import chisquare

from packrl.errors import UsageError
from packrl.train.replay import ReplayBuffer
from tests.replay_streams import GAMMA, add, check_nstep, reference_slots, reference_starts, stream


@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(1, 40), st.integers(2, 16), st.integers(1, 4),
       st.sampled_from([0.0, 0.2, 0.6]), st.sampled_from([0.0, 0.3]), st.booleans())
def test_nstep_samples_match_reference(seed, rows, steps, capacity, n, p_end, p_mask, prioritized):
    rng = np.random.default_rng(seed)
    events = stream(rng, steps, rows, p_end, p_mask)
    buf = ReplayBuffer(capacity, rows, (), np.int64, gamma=GAMMA, seed=seed, prioritized=prioritized)
    for event in events:
        add(buf, event)
    slots = reference_slots(events, rows, capacity)
    starts = reference_starts(slots, rows)
    assert set(buf.starts[:buf.transitions].tolist()) == starts
    assert buf.transitions == len(starts)
    if not starts:
        with pytest.raises(ValueError, match="no transition"):
            buf.sample(8, n)
        return
    batch = buf.sample(64, n)
    check_nstep(batch, slots, n, rows)
    assert set(batch.indices.tolist()) <= starts


def test_uniform_sampling_covers_every_start_equally():
    """Chi-square of 200k draws over the starts of a buffer with many episode ends and a wrapped ring."""
    rng = np.random.default_rng(3)
    rows, capacity = 4, 32
    buf = ReplayBuffer(capacity, rows, (), np.int64, gamma=GAMMA, seed=3)
    for event in stream(rng, 100, rows, 0.4, 0.2):
        add(buf, event)
    draws = np.concatenate([buf.sample(10_000).indices for _ in range(20)])
    starts = np.sort(buf.starts[:buf.transitions])
    counts = np.array([np.count_nonzero(draws == f) for f in starts])
    assert counts.sum() == draws.size, "only starts are drawn"
    assert chisquare(counts).pvalue > 1e-3
    # and a biased sampler fails the same test: a sanity check that the test can fail
    biased = counts.copy()
    biased[: len(biased) // 2] = biased[: len(biased) // 2] * 11 // 10
    assert chisquare(biased, biased.sum() / len(biased) * np.ones(len(biased))).pvalue < 1e-3


def test_truncation_bootstraps_from_the_final_observation_of_a_real_env():
    env = gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=5)
    buf = ReplayBuffer(64, 1, (4,), np.float32, gamma=GAMMA, seed=0)
    obs, _ = env.reset(seed=1)
    finals = []
    for _ in range(12):
        action = 0 if len(finals) % 2 else 1
        new_obs, reward, term, trunc, _ = env.step(action)
        final = new_obs.copy()
        if term or trunc:
            finals.append((final, bool(term)))
            new_obs, _ = env.reset()
        buf.add(obs[None], np.array([action]), np.array([reward], np.float32), np.array([term]), np.array([trunc]),
                final[None])
        obs = new_obs
    batch = buf.sample(256, n=10)
    assert finals, "the env must have ended at least once"
    assert any(not terminated for _, terminated in finals), "the time limit must have truncated an episode"
    for final, terminated in finals:
        hits = np.all(batch.next_observations == final, axis=1)
        assert hits.any()
        if terminated:
            assert np.all(batch.discounts[hits] == 0.0)
        else:  # bootstrap from the final observation with gamma ** steps
            assert np.allclose(batch.discounts[hits], GAMMA ** batch.steps[hits])
    # No transition ever crosses from an episode into the next one's first observation.
    assert np.all(batch.steps <= 5)


def test_refuses_input_it_would_have_to_cast_or_guess():
    buf = ReplayBuffer(8, 2, (3,), np.uint8, gamma=GAMMA)
    ok = dict(observations=np.zeros((2, 3), np.uint8), actions=np.zeros(2, np.int64), rewards=np.zeros(2, np.float32),
              terminals=np.zeros(2, bool), truncations=np.zeros(2, bool), final_observations=np.zeros((2, 3), np.uint8))
    buf.add(**ok)
    for field, bad, words in [("observations", np.zeros((2, 3), np.float32), "observations must be uint8"),
                              ("observations", np.zeros((3, 3), np.uint8), "observations must be uint8 \\(2, 3\\)"),
                              ("actions", np.zeros(2, np.float64), "actions must be int64"),
                              ("actions", np.zeros(2, np.uint64), "actions must be int64"),
                              ("terminals", np.zeros(2, np.float32), "terminals must be bool"),
                              ("rewards", np.zeros(3, np.float32), "rewards must have shape \\(2,\\)")]:
        with pytest.raises(UsageError, match=words):
            buf.add(**{**ok, field: bad})
    with pytest.raises(UsageError, match="final_observations must be uint8"):
        buf.add(**{**ok, "terminals": np.array([True, False]), "final_observations": np.zeros((2, 4), np.uint8)})
    with pytest.raises(UsageError, match="batch_size must be an int >= 1"):
        buf.sample(0)
    with pytest.raises(UsageError, match="n must be an int >= 1"):
        buf.sample(4, n=1.5)
    with pytest.raises(UsageError, match="no transition yet"):
        ReplayBuffer(8, 2, (3,), np.uint8).sample(4)
    with pytest.raises(UsageError, match="capacity must be an int >= 2"):
        ReplayBuffer(1, 2, (3,), np.uint8)
    with pytest.raises(UsageError, match="prioritized=True"):
        buf.add(**ok)
        buf.update_priorities(buf.sample(4), np.ones(4))
