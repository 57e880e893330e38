"""Rewards and end flags are checked before they are stored: per-agent lists, strings, None and
rewards that overflow float32 are refused naming the field, the value, the env (and the agent or
env index); bools and real numbers of every common type are stored."""
from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

from packrl import EmulationError, EnvError
from packrl.emulation import emulate
from packrl.vector import make as make_vector


class Returns(gym.Env):
    """Steps return the given reward and flags (from the env whose reset seed is ``bad_seed``, or every env)."""

    observation_space = spaces.Dict({"x": spaces.Box(-1, 1, (2,), np.float32), "k": spaces.Discrete(3)})
    action_space = spaces.Discrete(2)

    def __init__(self, reward=0.0, terminated=False, truncated=False, bad_seed=None):
        self.out = (reward, terminated, truncated)
        self.bad_seed, self.seed_ = bad_seed, None

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed_ = seed
        return {"x": np.zeros(2, np.float32), "k": 1}, {}

    def step(self, action):
        if self.bad_seed is None or self.seed_ == self.bad_seed:
            return {"x": np.zeros(2, np.float32), "k": 2}, *self.out, {}
        return {"x": np.zeros(2, np.float32), "k": 2}, 0.0, False, False, {}


def step_once(env):
    env.reset(seed=0)
    return env.step(np.array([1]))


@pytest.mark.parametrize("field", ["terminated", "truncated"])
@pytest.mark.parametrize("value", [[False, False], (True,), {0: False, 1: False}, "no", 0, 1, None,
                                   np.array([False, True])])
def test_flags_that_are_not_bools_are_refused(field, value):
    env = emulate(Returns(**{field: value}))
    with pytest.raises(EmulationError, match=field) as info:
        step_once(env)
    text = str(info.value)
    assert "Returns" in text and repr(value)[:20] in text
    assert env.terminals[0] == False and env.truncations[0] == False  # noqa: E712 - nothing was stored
    if isinstance(value, (list, tuple, dict, np.ndarray)):
        assert "agents='tuple'" in text  # per-agent flags: the refusal names the option


@pytest.mark.parametrize("value", [True, np.True_, np.array(True)])
def test_bool_flags_are_stored(value):
    env = emulate(Returns(terminated=value))
    _, _, terminals, truncations, _ = step_once(env)
    assert terminals[0] == True and truncations[0] == False  # noqa: E712
    assert np.array_equal(env.final_observations, env.observations)


@pytest.mark.parametrize("value", [None, "1", [1.0], [0, 0], np.array([1.0, 2.0]), {0: 1.0}, True, np.False_,
                                   1e300, -1e300, float("inf"), float("nan"), np.float64(1e39), 10**400,
                                   complex(1, 0)])
def test_rewards_that_are_not_finite_real_numbers_are_refused(value):
    env = emulate(Returns(reward=value))
    with pytest.raises(EmulationError, match="reward") as info:
        step_once(env)
    assert "Returns" in str(info.value)
    assert env.rewards[0] == 0.0


@pytest.mark.parametrize("value,stored", [(1, 1.0), (-3, -3.0), (0.5, 0.5), (np.float64(0.25), 0.25),
                                          (np.float32(2.5), 2.5), (np.int32(-7), -7.0), (np.uint8(200), 200.0),
                                          (np.array(1.5), 1.5), (10**20, 1e20), (3.4e38, np.float32(3.4e38))])
def test_real_rewards_are_stored(value, stored):
    env = emulate(Returns(reward=value))
    _, rewards, _, _, _ = step_once(env)
    assert rewards[0] == np.float32(stored)


def test_non_finite_rewards_are_stored_when_declared():
    for value in (float("inf"), -1e300, float("nan")):
        env = emulate(Returns(reward=value), finite_rewards=False)
        _, rewards, _, _, _ = step_once(env)
        assert np.array_equal(rewards, np.float32([value]), equal_nan=True)
    with pytest.raises(EmulationError, match="real number"):  # a string stays refused
        step_once(emulate(Returns(reward="inf"), finite_rewards=False))


@pytest.mark.parametrize("backend,kwargs", [("serial", {}), ("multiprocessing", {"num_workers": 2, "main_envs": 0,
                                                                                   "context": "spawn"})])
def test_vector_refusal_names_the_env_index(backend, kwargs):
    # env 2 (seed 10 + 2) returns per-agent flags; the others are well behaved
    creator = functools.partial(Returns, terminated=[False, False], bad_seed=12)
    with make_vector(creator, 4, backend=backend, seed=10, **kwargs) as envs:
        envs.reset()
        with pytest.raises(EnvError, match="env 2") as info:
            envs.step(np.zeros(4, np.int64))
        assert "terminated=[False, False]" in str(info.value)
        with pytest.raises(EnvError):  # and later calls refuse
            envs.step(np.zeros(4, np.int64))


def test_vector_block_step_checks_rewards():
    creator = functools.partial(Returns, reward=np.array([1.0, 2.0]), bad_seed=1)
    with make_vector(creator, 3, backend="serial", seed=0) as envs:
        envs.reset()
        with pytest.raises(EnvError, match="env 1") as info:
            envs.step(np.zeros(3, np.int64))
        assert "reward=array([1., 2.])" in str(info.value)


class TwoAgents(ParallelEnv):
    """A two-agent ParallelEnv returning the given per-agent rewards and flags on its first step."""

    metadata = {"name": "two_agents"}

    def __init__(self, reward=0.0, terminated=False):
        self.possible_agents = ["a", "b"]
        self.reward, self.terminated = reward, terminated

    def observation_space(self, agent):
        return spaces.Box(0, 1, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        obs = {a: np.ones(2, np.float32) for a in self.agents}
        rewards = {"a": 0.0, "b": self.reward}
        terminations = {"a": False, "b": self.terminated}
        truncations = {a: False for a in self.agents}
        return obs, rewards, terminations, truncations, {a: {} for a in self.agents}


@pytest.mark.parametrize("kind", ["parallel", "aec"])
def test_pettingzoo_per_agent_checks(kind):
    def make(**kw):
        env = TwoAgents(**kw)
        return emulate(parallel_to_aec(env) if kind == "aec" else env)

    def play(env):
        env.reset(seed=0)
        for _ in range(3):
            env.step(np.zeros(2, np.int64))

    with pytest.raises(EmulationError, match=r"agent 'b'.*terminated=\[True\]"):
        play(make(terminated=[True]))
    with pytest.raises(EmulationError, match=r"agent 'b'.*terminated='yes'"):
        play(make(terminated="yes"))
    if kind == "parallel":  # the AEC wrapper adds rewards up itself, before packrl sees them
        with pytest.raises(EmulationError, match=r"agent 'b'.*reward=None"):
            play(make(reward=None))
    with pytest.raises(EmulationError, match=r"agent 'b'.*not finite in float32"):
        play(make(reward=1e300))
    env = make(reward=np.float64(2.5), terminated=np.True_)
    env.reset(seed=0)
    env.step(np.zeros(2, np.int64))
    if kind == "aec":
        env.step(np.zeros(2, np.int64))
    assert env.terminals[1] and env.rewards[1] == 2.5
