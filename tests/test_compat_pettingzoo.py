"""packrl.compat.pettingzoo: an emulated multi-agent env as a PettingZoo Parallel or AEC env whose
observations are the agents' packed rows. PettingZoo's own API tests pass on both forms over real
envs (MPE, knights-archers-zombies with deaths, tic-tac-toe's Dict observations, lbforaging through
agents="tuple"); the rows equal the raw env's observations packed; SuperSuit's recipe runs after it.
Also: the agents="tuple" adapter passes parallel_api_test (its infos keyed per agent)."""
from __future__ import annotations

import warnings

import gymnasium
import lbforaging  # noqa: F401 - registers Foraging-*
import numpy as np
import pytest
import rware  # noqa: F401 - registers rware-*
from gymnasium import spaces
from pettingzoo.test import api_test, parallel_api_test
from pettingzoo.utils.conversions import turn_based_aec_to_parallel
from pettingzoo.utils.env import AECEnv

from packrl import UsageError, vector
from packrl.compat.pettingzoo import PackedParallelEnv, as_pettingzoo
from packrl.emulation import emulate
from packrl.emulation.tuple_agents import TupleAgents

# What PettingZoo's tests warn about the API itself (keys of the step's dicts, agents, spaces): never allowed.
API_WARNINGS = ("Live agent was not given", "was dead last turn", "No agents present", "exact same space",
                "not all possible_agents", "possible_agents")


def spread():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=25)


def zombies():
    from pettingzoo.butterfly import knights_archers_zombies_v11

    return knights_archers_zombies_v11.parallel_env(spawn_delay=5)


def tictactoe():
    """tic-tac-toe's Dict observation (board + action mask), both players observing every step."""
    from pettingzoo.classic import tictactoe_v3

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return turn_based_aec_to_parallel(tictactoe_v3.env())


def foraging():
    return gymnasium.make("Foraging-8x8-2p-1f-v3")


# name -> (emulated env maker, warnings PettingZoo's content checks give about the env's own data)
ENVS = {
    "simple_spread": (lambda: emulate(spread()), ("observation space value is",)),  # its Box is unbounded
    "knights_archers_zombies": (lambda: emulate(zombies()), ("graphical observation",)),  # (27, 5) in [-1, 1]
    "tictactoe": (lambda: emulate(tictactoe()), ("all zeros",)),  # the empty board of the player not to move
    "foraging_tuple": (lambda: emulate(foraging(), agents="tuple"), ("reward returned by `step()`",)),  # gym's check
}


def run_checked(test, env, allowed):
    """Run one of PettingZoo's API tests; fail on any warning but those about the env's own data."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        test(env, num_cycles=1000)
    messages = {str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)}
    unexpected = [m for m in messages if any(k in m for k in API_WARNINGS) or not any(a in m for a in allowed)]
    assert not unexpected, unexpected


@pytest.mark.parametrize("name", list(ENVS))
def test_parallel_form_passes_parallel_api_test(name):
    make, allowed = ENVS[name]
    env = as_pettingzoo(make())
    assert isinstance(env, PackedParallelEnv)
    run_checked(parallel_api_test, env, allowed)


@pytest.mark.parametrize("name", list(ENVS))
def test_aec_form_passes_api_test(name):
    make, allowed = ENVS[name]
    env = as_pettingzoo(make(), api="aec")
    assert isinstance(env, AECEnv)
    assert list(env.possible_agents) == list(as_pettingzoo(make()).possible_agents)  # the Parallel form's agents
    run_checked(api_test, env, allowed)


def test_observations_are_the_packed_rows_of_the_raw_env():
    """tic-tac-toe: each agent's observation is a uint8 row that unpacks (its Layout) to the raw twin's
    Dict observation; rewards, flags and infos are the raw env's, actions reach it as given."""
    emulated, raw = emulate(tictactoe()), tictactoe()
    env = as_pettingzoo(emulated)
    agents = env.possible_agents
    assert all(env.observation_space(a) == spaces.Box(0, 255, (emulated.emulated.nbytes,), np.uint8) for a in agents)
    assert all(env.action_space(a) == spaces.Discrete(9) for a in agents)
    rng, games = np.random.default_rng(0), 0
    for seed in range(6):
        obs, infos = env.reset(seed=seed)
        raw_obs, raw_infos = raw.reset(seed=seed)
        while True:
            assert env.agents == raw.agents and obs.keys() == raw_obs.keys() and infos == raw_infos
            for agent in obs:
                assert obs[agent].dtype == np.uint8
                native = emulated.emulated.observation_for(agent).unpack(obs[agent])
                for key in ("observation", "action_mask"):
                    np.testing.assert_array_equal(native[key], raw_obs[agent][key])
            if not env.agents:
                break
            actions = {a: int(rng.choice(np.flatnonzero(raw_obs[a]["action_mask"]) if raw_obs[a]["action_mask"].any()
                                         else np.arange(9))) for a in env.agents}
            obs, rewards, terms, truncs, infos = env.step(actions)
            raw_obs, raw_rewards, raw_terms, raw_truncs, raw_infos = raw.step(actions)
            assert rewards == {a: float(r) for a, r in raw_rewards.items()}
            assert terms == raw_terms and truncs == raw_truncs
        games += 1
    assert games == 6


def test_agents_that_die_leave_with_their_final_observation():
    """knights-archers-zombies against its raw twin: an agent that dies is in that step's dicts with its
    final observation, then gone from agents and from every later dict."""
    env, raw = as_pettingzoo(emulate(zombies())), zombies()
    obs, _ = env.reset(seed=4)
    raw_obs, _ = raw.reset(seed=4)
    rng, deaths = np.random.default_rng(4), 0
    while raw.agents:
        actions = {a: int(rng.integers(6)) for a in raw.agents}
        obs, rewards, terms, truncs, _ = env.step(actions)
        raw_obs, raw_rewards, raw_terms, raw_truncs, _ = raw.step(actions)
        assert obs.keys() == raw_obs.keys() and env.agents == raw.agents
        for agent in obs:
            np.testing.assert_array_equal(obs[agent], raw_obs[agent])
        assert rewards == {a: float(r) for a, r in raw_rewards.items()}
        assert terms == raw_terms and truncs == raw_truncs
        if raw.agents:  # agents that died while others play on
            deaths += sum(terms.values())
    assert deaths, "no agent died before the episode's end"


def test_supersuits_recipe_runs_after_packrl():
    """MPE simple_adversary's agents observe Boxes of 8 and 10 floats: SuperSuit refuses them as they
    are, takes them as packrl rows (one uint8 Box for every agent) and gives SB3 one env per agent."""
    import supersuit
    from mpe2 import simple_adversary_v3

    with pytest.raises(AssertionError, match="observation spaces not consistent"):
        supersuit.pettingzoo_env_to_vec_env_v1(simple_adversary_v3.parallel_env())
    emulated = emulate(simple_adversary_v3.parallel_env())
    venv = supersuit.concat_vec_envs_v1(supersuit.pettingzoo_env_to_vec_env_v1(as_pettingzoo(emulated)), 2,
                                        num_cpus=0, base_class="stable_baselines3")
    assert venv.num_envs == 6 and venv.observation_space.dtype == np.uint8
    rows, _ = venv.venv.reset(seed=0)
    twin = simple_adversary_v3.parallel_env()
    raw_obs, _ = twin.reset(seed=0)
    for i, agent in enumerate(twin.possible_agents):
        layout = emulated.emulated.observation_for(agent)
        np.testing.assert_array_equal(layout.unpack(rows[i, :layout.nbytes]), raw_obs[agent])
    obs, rewards, dones, _ = venv.step(np.zeros(6, np.int64))
    assert obs.shape == (6, emulated.emulated.nbytes) and rewards.shape == (6,)


@pytest.mark.parametrize("env_id", ["Foraging-8x8-2p-1f-v3", "rware-tiny-2ag-v2"])
def test_tuple_agents_adapter_passes_parallel_api_test(env_id):
    """The agents="tuple" adapter's infos are keyed per agent (each a copy of the env's one info)."""
    env = TupleAgents(gymnasium.make(env_id))
    run_checked(parallel_api_test, env, ("reward returned by `step()`",))
    _, infos = env.reset(seed=0)
    assert set(infos) == {"agent_0", "agent_1"} and infos["agent_0"] is not infos["agent_1"]
    _, _, _, _, infos = env.step({"agent_0": 0, "agent_1": 0})
    raw = gymnasium.make(env_id)
    raw.reset(seed=0)
    raw_info = raw.step((0, 0))[4]
    assert infos.keys() == {"agent_0", "agent_1"} and all(info.keys() == raw_info.keys() for info in infos.values())


def test_refusals_name_what_to_use():
    from pettingzoo.classic import tictactoe_v3

    with pytest.raises(UsageError, match="api='gym': choose 'parallel' or 'aec'"):
        as_pettingzoo(emulate(spread()), api="gym")
    with pytest.raises(UsageError, match="turn-based AEC env.*parallel_env\\(\\)"):
        as_pettingzoo(emulate(tictactoe_v3.env()))
    with pytest.raises(UsageError, match="single-agent env; use packrl.compat.gymnasium.as_gymnasium"):
        as_pettingzoo(emulate(gymnasium.make("CartPole-v1")))
    envs = vector.make(spread, 2)
    with pytest.raises(UsageError, match="not a vector env"):
        as_pettingzoo(envs)
    envs.close()
    with pytest.raises(UsageError, match="takes emulate\\(parallel_env\\)"):
        as_pettingzoo(spread())
