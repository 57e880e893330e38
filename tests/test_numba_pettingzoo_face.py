"""Every Numba env has a PettingZoo face: one copy as a ParallelEnv passing PettingZoo's parallel_api_test, and
as an AECEnv passing api_test; its native observations and actions match the batched env's rows."""
import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test

import packrl.envs as envs
from packrl.envs.pettingzoo_face import aec_env, parallel_env
from packrl.errors import EmulationError, UsageError


@pytest.mark.parametrize("name", [name for name in envs.names() if not envs.spec(name).turns])
def test_parallel_api_test_passes(name):
    parallel_api_test(parallel_env(name), num_cycles=200)


def test_a_turn_based_env_has_no_parallel_form():
    with pytest.raises(UsageError, match="moves in turns"):
        parallel_env("connect_four")


def test_the_turn_based_aec_face_plays_connect_four_like_pettingzoo():
    from pettingzoo.classic import connect_four_v3

    ours, ref = aec_env("connect_four"), connect_four_v3.env()
    ours.reset(seed=0)
    ref.reset(seed=0)
    for column in [3, 4, 3, 4, 3, 4, 3]:  # player_0 wins down column 3
        assert ours.agent_selection == ref.agent_selection
        mine, theirs = ours.last(), ref.last()
        np.testing.assert_array_equal(mine[0]["observation"], theirs[0]["observation"])
        np.testing.assert_array_equal(mine[0]["action_mask"], theirs[0]["action_mask"])
        assert mine[1:4] == theirs[1:4]
        ours.step(column)
        ref.step(column)
    for agent in ours.agent_iter():
        assert agent == ref.agent_selection
        mine, theirs = ours.last(), ref.last()
        assert mine[1:4] == theirs[1:4]
        np.testing.assert_array_equal(mine[0]["observation"], theirs[0]["observation"])
        ours.step(None)
        ref.step(None)
    assert ours.agents == ref.agents == []


@pytest.mark.parametrize("name", envs.names())
def test_aec_api_test_passes(name):
    api_test(aec_env(name), num_cycles=100)


def test_an_episode_ends_with_empty_agents_and_final_observations():
    env = parallel_env("simple_spread", seed=3)
    obs, infos = env.reset(seed=3)
    assert env.agents == ["agent_0", "agent_1", "agent_2"] and set(obs) == set(env.agents)
    batched = envs.make("simple_spread", num_envs=1, seed=3)
    rows, _ = batched.reset(seed=3)
    for k, agent in enumerate(env.possible_agents):
        np.testing.assert_array_equal(obs[agent], rows[k])
    for t in range(25):
        acts = {agent: (t + k) % 5 for k, agent in enumerate(env.agents)}
        obs, rew, term, trunc, _ = env.step(acts)
        rows, rewards, _, truncations, _ = batched.step(np.array([acts[a] for a in env.possible_agents]))
        last = batched.final_observations if truncations.any() else rows
        for k, agent in enumerate(env.possible_agents):
            np.testing.assert_array_equal(obs[agent], last[k])
            assert rew[agent] == pytest.approx(float(rewards[k]))
    assert all(trunc.values()) and env.agents == []
    with pytest.raises(EmulationError, match="not alive"):
        env.step({"agent_0": 0})


def test_gridworld_face_gives_native_dict_observations_and_takes_native_actions():
    env = parallel_env("gridworld")
    obs, _ = env.reset(seed=0)
    space = env.observation_space("agent_0")
    assert space.contains(obs["agent_0"]) and set(obs["agent_0"]) == {"image", "position", "direction"}
    with pytest.raises(EmulationError, match="outside its action space"):
        env.step({"agent_0": np.array([4, 0])})
    with pytest.raises(UsageError, match="dict"):
        env.step([0, 1])
