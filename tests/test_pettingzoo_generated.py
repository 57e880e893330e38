"""A generated ParallelEnv: random spaces per agent, random deaths, spawns and rewards to absent
agents. Every agent's observation must come back bit for bit at every step, every action must
reach the env in its native form, and every reward must be delivered exactly once."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st
from pettingzoo.utils.env import ParallelEnv
from spaces_strategies import extreme, nested_spaces, sample

from packrl import EmulationError
from packrl.emulation import emulate
from packrl.nativize import nativize


class ScriptedParallelEnv(ParallelEnv):
    """Agents appear, end (terminated or truncated) and reappear at random; some rewards go to agents
    that are not there. ``last`` keeps the latest step's outputs and ``received`` the actions."""

    metadata = {"name": "scripted_parallel_v0"}

    def __init__(self, obs_spaces: dict, act_spaces: dict, p_end: float = 0.2, p_spawn: float = 0.2,
                 max_steps: int = 12):
        self.possible_agents = list(obs_spaces)
        self._obs_spaces, self._act_spaces = obs_spaces, act_spaces
        self.p_end, self.p_spawn, self.max_steps = p_end, p_spawn, max_steps
        self.agents: list = []

    def observation_space(self, agent):
        return self._obs_spaces[agent]

    def action_space(self, agent):
        return self._act_spaces[agent]

    def _observe(self, agent):
        space = self._obs_spaces[agent]
        return extreme(space, sample(space, self.rng), self.rng)

    def reset(self, seed=None, options=None):
        self.rng = np.random.default_rng(seed)
        self.steps = 0
        present = self.rng.random(len(self.possible_agents)) < 0.7
        present[int(self.rng.integers(len(present)))] = True
        self.agents = [a for a, p in zip(self.possible_agents, present) if p]
        obs = {a: self._observe(a) for a in self.agents}
        self.last = (obs, {}, {}, {})
        return obs, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        for agent, action in actions.items():
            assert self._act_spaces[agent].contains(action), (agent, action)
        self.received = actions
        self.steps += 1
        obs, rewards, terminations, truncations = {}, {}, {}, {}
        staying = []
        for agent in self.agents:
            draw = self.rng.random()
            terminations[agent] = bool(draw < self.p_end / 2)
            truncations[agent] = bool(self.p_end / 2 <= draw < self.p_end or self.steps >= self.max_steps)
            rewards[agent] = int(self.rng.integers(-3, 4))
            obs[agent] = self._observe(agent)
            if not (terminations[agent] or truncations[agent]):
                staying.append(agent)
        absent = [a for a in self.possible_agents if a not in self.agents]
        if absent and self.rng.random() < 0.3:  # a reward for an agent that is not there
            lucky = absent[int(self.rng.integers(len(absent)))]
            rewards[lucky] = int(self.rng.integers(1, 4))
        if self.steps < self.max_steps:
            for agent in absent:
                if self.rng.random() < self.p_spawn:
                    obs[agent] = self._observe(agent)
                    staying.append(agent)
        self.agents = [a for a in self.possible_agents if a in staying]
        self.last = (obs, rewards, terminations, truncations)
        return obs, rewards, terminations, truncations, {a: {} for a in obs}


# ---------------------------------------------------------------- comparisons

def assert_bit_equal(native, sample, where: str) -> None:
    """``native`` (Layout.to_native of the row) equals ``sample``: dtype and bits for arrays."""
    if isinstance(sample, dict):
        assert list(native) == list(sample), where
        for key in sample:
            assert_bit_equal(native[key], sample[key], f"{where}[{key!r}]")
    elif isinstance(sample, tuple):
        assert isinstance(native, tuple) and len(native) == len(sample), where
        for i, (n, s) in enumerate(zip(native, sample)):
            assert_bit_equal(n, s, f"{where}[{i}]")
    elif isinstance(sample, str):
        assert native == sample, where
    else:
        n, s = np.asarray(native), np.asarray(sample)
        assert n.shape == s.shape and n.dtype == s.dtype, (where, n.dtype, s.dtype)
        assert n.tobytes() == s.tobytes(), where


def check_row(wrapped, buf: np.ndarray, agent, sample) -> None:
    layout = wrapped.emulated.observation_for(agent)
    row = buf[wrapped.emulated.row_of(agent)]
    if wrapped.passthrough:
        assert row.dtype == sample.dtype and row.tobytes() == sample.tobytes(), agent
        return
    assert not row[layout.nbytes:].any(), f"bytes past {agent}'s layout must stay zero"
    assert_bit_equal(layout.to_native(layout.unpack(row[: layout.nbytes])), sample, repr(agent))


def assert_same_action(received, expected, where: str) -> None:
    if isinstance(expected, dict):
        for key in expected:
            assert_same_action(received[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, tuple):
        for i, (r, e) in enumerate(zip(received, expected)):
            assert_same_action(r, e, f"{where}[{i}]")
    else:
        r, e = np.asarray(received), np.asarray(expected)
        assert r.dtype == e.dtype and r.tobytes() == e.tobytes(), where


# ---------------------------------------------------------------- strategies

@st.composite
def action_spaces(draw):
    discrete = st.builds(lambda n, start: spaces.Discrete(n, start=start), st.integers(1, 30), st.integers(-5, 5))
    multi = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(lambda nvec: spaces.MultiDiscrete(nvec))
    box = st.builds(lambda n, dtype: spaces.Box(-2.0, 3.0, (n,), dtype), st.integers(1, 3),
                    st.sampled_from([np.float32, np.float64]))
    leaf = st.one_of(discrete, multi, box, st.integers(1, 3).map(spaces.MultiBinary))
    return draw(st.one_of(leaf, st.dictionaries(st.sampled_from("xyz"), leaf, min_size=1, max_size=3).map(spaces.Dict)))


@st.composite
def agent_spaces(draw):
    """2-6 agents drawing (observation, action) spaces from a pool of 1-3, so some share a group."""
    pool = draw(st.lists(st.tuples(nested_spaces, action_spaces()), min_size=1, max_size=3))
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=2, max_size=6))
    names = [f"agent_{i}" for i in range(len(picks))]
    return {n: pool[p][0] for n, p in zip(names, picks)}, {n: pool[p][1] for n, p in zip(names, picks)}


# ---------------------------------------------------------------- the property

@given(agent_spaces(), st.integers(0, 2**31 - 1))
def test_generated_env_round_trips_every_agent_every_step(space_pairs, seed):
    obs_spaces, act_spaces = space_pairs
    env = ScriptedParallelEnv(obs_spaces, act_spaces)
    wrapped = emulate(env)
    emulated = wrapped.emulated
    for agent in env.possible_agents:
        assert emulated.observation_for(agent).space == obs_spaces[agent]
    wrapped.reset(seed=seed)
    owed = {a: 0 for a in env.possible_agents}
    policy_rng = np.random.default_rng(seed)
    steps = 0
    check_step(wrapped, env, owed, steps)
    while not wrapped.done:
        policy = []
        for row in range(wrapped.num_agents):
            space = emulated.action_for(row).policy_space
            space.seed(int(policy_rng.integers(2**31)))
            policy.append(space.sample())
        wrapped.step(policy)
        steps += 1
        for agent, native in env.received.items():
            expected = emulated.action_for(agent).decode(policy[emulated.row_of(agent)])
            assert_same_action(native, expected, repr(agent))
        check_step(wrapped, env, owed, steps)
    assert not any(owed.values()), "every reward reached its agent by the end of the episode"
    assert not env.agents


def check_step(wrapped, env, owed: dict, steps: int) -> None:
    obs, rewards, terminations, truncations = env.last
    for agent, reward in rewards.items():
        owed[agent] += reward
    for row, agent in enumerate(env.possible_agents):
        ended = agent in obs and (terminations.get(agent, False) or truncations.get(agent, False))
        assert wrapped.terminals[row] == (ended and terminations[agent])
        assert wrapped.truncations[row] == (ended and truncations[agent])
        assert wrapped.masks[row] == (agent in env.agents), (steps, agent)
        if ended:
            check_row(wrapped, wrapped.final_observations, agent, obs[agent])
        if wrapped.masks[row]:
            check_row(wrapped, wrapped.observations, agent, obs[agent])
        else:
            assert not wrapped.observations[row].any(), f"absent {agent}'s row must be zeros"
        if wrapped.masks[row] or ended or wrapped.done:
            assert wrapped.rewards[row] == owed[agent], (steps, agent)
            owed[agent] = 0
        else:
            assert wrapped.rewards[row] == 0, (steps, agent)
    if not wrapped.passthrough:  # each group's rows read back on torch too (aligned typed views)
        for group in wrapped.emulated.groups:
            rows = torch.from_numpy(wrapped.emulated.rows_for(wrapped.observations, group).copy())
            nativize(rows, group.observation)


# ---------------------------------------------------------------- rows, groups and bad envs

def two_role_env(**kwargs) -> ScriptedParallelEnv:
    obs = {"scout_0": spaces.Box(0, 1, (3,), np.float64), "worker_0": spaces.Box(0, 255, (9,), np.uint8),
           "worker_1": spaces.Box(0, 255, (9,), np.uint8)}
    act = {"scout_0": spaces.Discrete(9), "worker_0": spaces.Discrete(25), "worker_1": spaces.Discrete(25)}
    return ScriptedParallelEnv(obs, act, **kwargs)


def test_rows_are_as_wide_as_the_widest_group_rounded_to_every_alignment():
    wrapped = emulate(two_role_env())
    scout, worker = wrapped.emulated.groups
    assert (scout.observation.nbytes, worker.observation.nbytes) == (24, 9)
    assert wrapped.emulated.nbytes == 24 and wrapped.single_observation_space.shape == (24,)
    assert worker.rows == (1, 2) and wrapped.single_action_space == spaces.Discrete(25)
    odd = emulate(ScriptedParallelEnv({"a": spaces.Box(0, 1, (1,), np.float64), "b": spaces.MultiBinary(9)},
                                      {"a": spaces.Discrete(2), "b": spaces.Discrete(2)}))
    assert odd.emulated.nbytes == 16  # 9 bytes of b rounded up to a's 8-byte alignment
    odd.reset(seed=0)
    rows = torch.from_numpy(odd.emulated.rows_for(odd.observations, 0))
    assert nativize(rows, odd.emulated.groups[0].observation).dtype == torch.float64


def test_every_agent_receives_every_one_of_its_own_actions():
    env = two_role_env(p_end=0.0, p_spawn=1.0, max_steps=30)
    wrapped = emulate(env)
    wrapped.reset(seed=0)
    wrapped.step(np.zeros(3, np.int64))  # every agent is present from here on (spawn probability 1)
    for choice in range(25):
        wrapped.step(np.array([choice % 9, choice, choice]))
        assert env.received == {"scout_0": choice % 9, "worker_0": choice, "worker_1": choice}
    with pytest.raises(EmulationError, match="action 9 for agent 'scout_0' is outside its Discrete\\(9\\)"):
        wrapped.step([9, 0, 0])


class RogueEnv(ScriptedParallelEnv):
    def __init__(self, mode: str):
        super().__init__({"a": spaces.Discrete(3), "b": spaces.Discrete(3)},
                         {"a": spaces.Discrete(2), "b": spaces.Discrete(2)}, p_end=0.0, p_spawn=0.0)
        self.mode = mode

    def reset(self, seed=None, options=None):
        self.rng, self.steps, self.agents = np.random.default_rng(seed), 0, ["a", "b"]
        return {"a": 0, "b": 1}, {}

    def step(self, actions):
        obs, rewards, terminations, truncations = {"a": 1, "b": 2}, {"a": 0, "b": 0}, {"a": False, "b": False}, \
            {"a": False, "b": False}
        infos = {"a": {}, "b": {}}
        if self.mode == "stranger":
            obs["c"] = 0
        elif self.mode == "vanish":
            del obs["b"]
        elif self.mode == "end_without_obs":
            del obs["b"]
            terminations["b"] = True
        elif self.mode == "bad_obs":
            obs["b"] = 7
        return obs, rewards, terminations, truncations, infos


@pytest.mark.parametrize("mode, message", [
    ("stranger", "the env reported agent 'c', which is not in possible_agents \\['a', 'b'\\]"),
    ("vanish", "agent 'b' was alive but the env returned neither an observation nor a termination"),
    ("end_without_obs", "the env ended agent 'b' without its final observation"),
    ("bad_obs", "agent 'b': observation does not fit its space: .*value 7 is outside Discrete\\(n=3"),
])
def test_env_misbehaviour_is_refused_naming_the_agent(mode, message):
    wrapped = emulate(RogueEnv(mode))
    wrapped.reset(seed=0)
    with pytest.raises(EmulationError, match=message):
        wrapped.step(np.zeros(2, np.int64))
