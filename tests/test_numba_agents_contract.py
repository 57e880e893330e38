"""The Numba agents contract against emulation: a small env where agents die and one joins mid-episode, written
once as Numba kernels and once as a PettingZoo ParallelEnv; vector.make gives both the same rows, masks, rewards,
flags and final observations, step by step, through ends, joins and same-step resets."""
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from pettingzoo.utils.env import ParallelEnv

from packrl import vector
from packrl.envs.numba_env import NumbaEnv
from packrl.errors import EnvError

AGENTS = ("a0", "a1", "a2")
JOIN_AT = 2
LIMIT = 6
OBS = spaces.Box(-100.0, 100.0, (2,), np.float32)
ACT = spaces.Discrete(3)


@njit
def _reset(state, obs, live, rng):
    state.steps[0] = 0
    for a in range(3):
        state.count[a] = 3 + a
        obs[a, 0], obs[a, 1] = state.count[a], 0.0
    live[2] = False  # a2 joins later


@njit
def _step(state, actions, obs, rewards, terminated, truncated, live, rng):
    state.steps[0] += 1
    for a in range(3):
        if live[a]:
            state.count[a] -= actions[a]
            rewards[a] = actions[a] + a
            terminated[a] = state.count[a] <= 0
            obs[a, 0], obs[a, 1] = state.count[a], state.steps[0]
    if state.steps[0] == JOIN_AT and not live[2] and (live[0] or live[1]) and not (terminated[0] and terminated[1]):
        live[2] = True
        obs[2, 0], obs[2, 1] = state.count[2], state.steps[0]


def numba_countdown() -> NumbaEnv:
    return NumbaEnv("countdown", OBS, ACT, {"count": (3, np.int64), "steps": (1, np.int64)}, _reset, _step,
                    max_episode_steps=LIMIT, agents=AGENTS)


class Countdown(ParallelEnv):
    """The same env, written for PettingZoo."""

    metadata = {"name": "countdown"}
    possible_agents = list(AGENTS)

    def observation_space(self, agent):
        return OBS

    def action_space(self, agent):
        return ACT

    def reset(self, seed=None, options=None):
        self.steps, self.count = 0, {a: 3 + k for k, a in enumerate(AGENTS)}
        self.agents = ["a0", "a1"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def _obs(self, agent):
        return np.array([self.count[agent], self.steps], np.float32)

    def step(self, actions):
        self.steps += 1
        obs, rew, term, trunc = {}, {}, {}, {}
        for agent in self.agents:
            k = AGENTS.index(agent)
            self.count[agent] -= int(actions[agent])
            rew[agent] = float(actions[agent] + k)
            term[agent] = self.count[agent] <= 0
            trunc[agent] = self.steps >= LIMIT and not term[agent]
            obs[agent] = self._obs(agent)
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        if self.steps == JOIN_AT and "a2" not in obs and self.agents:
            self.agents.append("a2")
            obs["a2"] = self._obs("a2")
        return obs, rew, term, trunc, {a: {} for a in obs}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_envs=st.integers(1, 4))
def test_rows_masks_and_flags_match_the_emulated_pettingzoo_env(seed, num_envs):
    ref = vector.make(Countdown, num_envs, backend="serial", seed=0)
    ours = vector.make(numba_countdown(), num_envs, backend="numba", seed=0)
    assert (ours.num_agents, ours.agents_per_env, tuple(ours.possible_agents)) == \
        (ref.num_agents, ref.agents_per_env, tuple(ref.possible_agents))
    o1, _ = ref.reset(seed=0)
    o2, _ = ours.reset(seed=0)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(ref.masks, ours.masks)
    rng = np.random.default_rng(seed)
    ends = joins = 0
    for t in range(30):
        before = ref.masks.copy()
        acts = rng.integers(0, 3, num_envs * 3)
        r1, r2 = ref.step(acts), ours.step(acts)
        for k, what in enumerate(("observations", "rewards", "terminals", "truncations")):
            np.testing.assert_array_equal(r1[k], r2[k], err_msg=f"step {t}: {what}")
        np.testing.assert_array_equal(ref.masks, ours.masks, err_msg=f"step {t}: masks")
        ended = r1[2] | r1[3]
        np.testing.assert_array_equal(ref.final_observations[ended], ours.final_observations[ended])
        ends += int(ended.sum())
        joins += int((ref.masks & ~before & ~ended).sum())
    assert ends > 0 and joins > 0  # the run met both an agent's end and an agent's join


def test_an_agents_observation_out_of_its_space_names_the_agent():
    @njit
    def bad_step(state, actions, obs, rewards, terminated, truncated, live, rng):
        for a in range(3):
            obs[a, 0] = np.nan if a == 1 else 0.0

    env = vector.make(NumbaEnv("bad", OBS, ACT, {"count": (3, np.int64), "steps": (1, np.int64)}, _reset, bad_step,
                               agents=AGENTS), 2,
                      backend="numba")
    env.reset()
    with pytest.raises(EnvError, match="env index 0, agent 'a1'.*NaN"):
        env.step(np.zeros(6, np.int64))


def test_agent_names_must_be_distinct():
    with pytest.raises(EnvError, match="distinct"):
        NumbaEnv("dup", OBS, ACT, {"count": (3, np.int64)}, _reset, _step, agents=("a", "a"))


@pytest.mark.parametrize("name", ["simple_spread", "connect_four"])
def test_halves_of_an_env_with_agents_step_as_the_whole(name):
    halves = vector.make(name, 4, backend="numba", seed=3, halves=True)
    whole = vector.make(name, 4, backend="numba", seed=3)
    assert (halves.num_envs, halves.num_agents, halves.agents_per_env) == (4, whole.num_agents, 3 if name == "simple_spread" else 2)
    assert halves.rows == (slice(0, whole.num_agents // 2), slice(whole.num_agents // 2, whole.num_agents))
    np.testing.assert_array_equal(halves.reset(seed=3)[0], whole.reset(seed=3)[0])
    np.testing.assert_array_equal(halves.masks, whole.masks)
    rng = np.random.default_rng(0)
    for _ in range(40):
        acts = rng.integers(0, 5, whole.num_agents) if name == "simple_spread" else \
            np.where(whole.masks, rng.integers(0, 7, whole.num_agents), 0)
        for a, b in zip(halves.step(acts)[:4], whole.step(acts)[:4]):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(halves.masks, whole.masks)
