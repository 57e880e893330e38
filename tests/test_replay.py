"""Replay buffer: n-step samples against a per-row reference built from the raw step stream."""
import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from packrl.train.replay import ReplayBuffer

GAMMA = 0.9


def _stream(rng, steps, rows, p_end, p_mask):
    """Observation ids are unique integers, so a sample tells exactly which slots it read."""
    events, next_id = [], rows
    obs = np.arange(rows)
    for _ in range(steps):
        term = rng.random(rows) < p_end / 2
        trunc = ~term & (rng.random(rows) < p_end / 2)
        masks = rng.random(rows) >= p_mask
        final = np.arange(next_id, next_id + rows)
        new_obs = np.arange(next_id + rows, next_id + 2 * rows)
        next_id += 2 * rows
        rewards = rng.normal(size=rows).astype(np.float32)
        events.append((obs.copy(), rewards, term, trunc, final, masks))
        obs = np.where(masks, new_obs, obs)
    return events


def _reference(events, rows, capacity):
    """Per row, the list of slots (obs, reward, discount, last), oldest first, as the buffer should hold them."""
    slots = [[] for _ in range(rows)]
    for obs, rewards, term, trunc, final, masks in events:
        for r in np.flatnonzero(masks):
            slots[r].append((obs[r], rewards[r], 0.0 if term[r] else GAMMA, False))
            if term[r] or trunc[r]:
                slots[r].append((final[r], 0.0, 0.0, True))
    return [s[-capacity:] for s in slots]


@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(1, 40), st.integers(2, 16), st.integers(1, 4),
       st.sampled_from([0.0, 0.2, 0.6]), st.sampled_from([0.0, 0.3]))
def test_nstep_samples_match_reference(seed, rows, steps, capacity, n, p_end, p_mask):
    rng = np.random.default_rng(seed)
    events = _stream(rng, steps, rows, p_end, p_mask)
    buf = ReplayBuffer(capacity, rows, (), np.int64, gamma=GAMMA, seed=seed)
    for obs, rewards, term, trunc, final, masks in events:
        buf.add(obs, obs, rewards, term, trunc, final, masks)
    ref = _reference(events, rows, capacity)
    if all(len(s) < 2 or all(x[3] for x in s[:-1]) for s in ref):
        with pytest.raises(ValueError, match="no"):
            buf.sample(8, n)
        return
    batch = buf.sample(64, n)
    for i in range(64):
        row_slots = ref[batch.rows[i]]
        start = [j for j, s in enumerate(row_slots) if s[0] == batch.observations[i]]
        assert len(start) == 1, "each observation is stored once"
        j = start[0]
        assert not row_slots[j][3] and j + 1 < len(row_slots)
        g, disc, k = 0.0, 1.0, 0
        while True:
            g += disc * row_slots[j + k][1]
            disc *= row_slots[j + k][2]
            k += 1
            nxt = j + k
            if k == n or nxt >= len(row_slots) - 1 or row_slots[nxt][3]:
                break
        assert batch.steps[i] == k
        assert batch.returns[i] == pytest.approx(g, rel=1e-5, abs=1e-5)
        assert batch.discounts[i] == pytest.approx(disc, rel=1e-6)
        assert batch.next_observations[i] == row_slots[j + k][0]
        assert batch.actions[i] == batch.observations[i]


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
    for final, terminated in finals:
        hits = np.all(batch.next_observations == final, axis=1)
        assert hits.any()
        expected = 0.0 if terminated else None
        if expected is not None:
            assert np.all(batch.discounts[hits] == 0.0)
        else:
            assert np.all(batch.discounts[hits] > 0.0)
    # No transition ever crosses from an episode into the next one's first observation.
    assert np.all(batch.steps <= 5)
