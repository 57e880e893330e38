"""gymnasium envs that hold several agents (lbforaging, rware): with ``emulate(env, agents="tuple")``
they step exactly as their raw twins, one row per agent; without it the per-agent rewards are
refused naming the option."""
from __future__ import annotations

import gymnasium as gym
import lbforaging  # noqa: F401  (registers Foraging-*)
import numpy as np
import pytest
import rware  # noqa: F401  (registers rware-*)
from gymnasium import spaces

from packrl import EmulationError
from packrl.emulation import emulate
from packrl.nativize import nativize
from packrl.vector import make as make_vector

ENVS = ["Foraging-8x8-2p-1f-v3", "rware-tiny-2ag-v2"]


@pytest.mark.parametrize("env_id", ENVS)
def test_steps_as_the_raw_env(env_id):
    env, raw = emulate(gym.make(env_id), agents="tuple"), gym.make(env_id)
    assert env.num_agents == 2 and env.possible_agents == ("agent_0", "agent_1")
    layout = env.emulated.observation
    rng = np.random.default_rng(3)
    ends = 0
    for episode in range(2):
        obs, _ = env.reset(seed=episode)
        raw_obs, _ = raw.reset(seed=episode)
        assert np.array_equal(nativize(obs, layout), np.stack(raw_obs)) and env.masks.all()
        for t in range(600):
            actions = rng.integers(0, env.single_action_space.n, size=2)
            obs, rewards, terminals, truncations, _ = env.step(actions)
            raw_obs, raw_rewards, raw_term, raw_trunc, _ = raw.step(tuple(int(a) for a in actions))
            assert rewards.dtype == np.float32 and np.array_equal(rewards, np.float32(raw_rewards))
            assert terminals.tolist() == [raw_term] * 2 and truncations.tolist() == [raw_trunc] * 2
            if raw_term or raw_trunc:  # the agents' last observations; the rows are gone (masked zeros)
                assert np.array_equal(env.final_observations, np.stack(raw_obs))
                assert not env.masks.any() and not obs.any() and env.done
                ends += 1
                break
            assert np.array_equal(obs, np.stack(raw_obs)) and env.masks.all() and not env.done
    assert ends == 2


@pytest.mark.parametrize("env_id", ENVS)
def test_without_the_option_the_refusal_names_it(env_id):
    env = emulate(gym.make(env_id))
    env.reset(seed=0)
    with pytest.raises(EmulationError, match=r"reward=.*agents='tuple'"):
        env.step(np.zeros((1, 2), np.int64))


def test_vector_env_of_tuple_agents():
    creator = lambda: emulate(gym.make("Foraging-8x8-2p-1f-v3"), agents="tuple")  # noqa: E731
    raws = [gym.make("Foraging-8x8-2p-1f-v3") for _ in range(2)]
    with make_vector(creator, 2, backend="serial", seed=5) as envs:
        obs, _ = envs.reset()
        assert obs.shape == (4, 9)
        raw_obs = [r.reset(seed=5 + i)[0] for i, r in enumerate(raws)]
        assert all(np.array_equal(obs[2 * i: 2 * i + 2], np.stack(o)) for i, o in enumerate(raw_obs))
        rng = np.random.default_rng(0)
        for _ in range(120):
            actions = rng.integers(0, 6, size=4)
            obs, rewards, terminals, _, _ = envs.step(actions)
            for i, raw in enumerate(raws):
                o, r, term, trunc, _ = raw.step(tuple(int(a) for a in actions[2 * i: 2 * i + 2]))
                assert np.array_equal(rewards[2 * i: 2 * i + 2], np.float32(r))
                if term or trunc:
                    assert np.array_equal(envs.final_observations[2 * i: 2 * i + 2], np.stack(o))
                    o, _ = raw.reset()
                assert np.array_equal(obs[2 * i: 2 * i + 2], np.stack(o))


class PerAgentFlags(gym.Env):
    """Two agents; agent 1 ends at step 2 (its own flag), agent 0 at step 4. Records the actions it gets."""

    observation_space = spaces.Tuple([spaces.Box(0, 9, (1,), np.float32)] * 2)
    action_space = spaces.Tuple([spaces.Discrete(3)] * 2)

    def reset(self, seed=None, options=None):
        self.t, self.actions = 0, []
        return (np.zeros(1, np.float32), np.zeros(1, np.float32)), {}

    def step(self, action):
        self.t += 1
        self.actions.append(tuple(int(a) for a in action))
        obs = (np.full(1, self.t, np.float32), np.full(1, 10 - self.t, np.float32))
        return obs, [1.0, 2.0], [self.t >= 4, self.t >= 2], False, {}


def test_per_agent_flags_end_each_agent_once():
    env = emulate(PerAgentFlags(), agents="tuple")
    env.reset()
    env.step(np.array([1, 2]))
    assert env.masks.tolist() == [True, True] and env.rewards.tolist() == [1.0, 2.0]
    env.step(np.array([0, 1]))  # agent 1 ends: reported once, final observation, masked from now on
    assert env.terminals.tolist() == [False, True] and env.masks.tolist() == [True, False]
    assert env.final_observations[1, 0] == 8 and env.observations[1, 0] == 0
    env.step(np.array([2, 0]))
    assert env.terminals.tolist() == [False, False] and env.rewards.tolist() == [1.0, 0.0]
    env.step(np.array([1, 0]))
    assert env.terminals.tolist() == [True, False] and env.done
    assert env.rewards.tolist() == [1.0, 4.0]  # agent 1's rewards after its end: kept, delivered at the end
    assert env.env.env.actions == [(1, 2), (0, 1), (2, 1), (1, 1)]  # agent 1 was sent its last action


def test_tuple_option_refuses_what_is_not_a_tuple_env():
    with pytest.raises(EmulationError, match="Tuple observation and action space"):
        emulate(gym.make("CartPole-v1"), agents="tuple")
    with pytest.raises(EmulationError, match="agents="):
        emulate(gym.make("CartPole-v1"), agents="dict")


def test_int_agent_names_and_rows_are_kept_apart():
    from pettingzoo import ParallelEnv

    class Env(ParallelEnv):
        metadata = {"name": "int_names"}
        possible_agents = [1, 0, 7]

        def observation_space(self, agent):
            return spaces.Box(0, 1, (5,), np.float32) if agent == 1 else spaces.Discrete(4)

        def action_space(self, agent):
            return spaces.Discrete(2)

    emulated = emulate(Env()).emulated
    five_floats, discrete = emulated.observation_for_row(0), emulated.observation_for_row(1)
    assert five_floats.leaves[0].shape == (5,) and discrete.leaves[0].kind == "discrete"
    # 0 names agent 0 (row 1) and is the row of agent 1: refused, never read as either silently
    for call in (emulated.observation_for, emulated.action_for, emulated.row_of):
        with pytest.raises(EmulationError, match="ambiguous"):
            call(0)
        with pytest.raises(EmulationError, match="ambiguous"):
            call(np.int64(1))
    assert emulated.observation_for_agent(0) == discrete and emulated.observation_for_agent(1) == five_floats
    assert emulated.row_of_agent(0) == 1 and emulated.row_of_agent(7) == 2
    assert emulated.observation_for(7) == discrete  # a name that is no other agent's row
    assert emulated.observation_for(2) == discrete  # a row that is no agent's name
    with pytest.raises(EmulationError, match="not one of the env's possible agents"):
        emulated.observation_for_agent(2)
    with pytest.raises(EmulationError, match="rows are 0..2"):
        emulated.observation_for_row(7)
