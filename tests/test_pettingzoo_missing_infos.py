"""Strict where data would be lost, tolerant where nothing is: a Parallel env's step may leave an agent out of
its infos (it reads as ``{}``, one warning per env); rewards and flags stay strict. Tested on multigrid's own
PettingZoo env, whose infos are an empty ``defaultdict(dict)``, with the codec the docs register for it."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces
from multigrid.core.mission import MissionSpace
from multigrid.envs import EmptyEnv
from multigrid.pettingzoo import to_pettingzoo_env
from pettingzoo import ParallelEnv
from test_register_space_multigrid import MissionCodec

from packrl.compat.pettingzoo import as_pettingzoo
from packrl.emulation import codecs, emulate, register_space
from packrl.errors import EmulationError, UsageError
from packrl.vector import make as make_vector

MultiGridEmpty = to_pettingzoo_env(EmptyEnv, metadata={"name": "multigrid_empty_v0"})


@pytest.fixture
def mission_codec():
    before = dict(codecs._BUILDERS)
    register_space(MissionSpace, MissionCodec)
    yield
    codecs._BUILDERS.clear()
    codecs._BUILDERS.update(before)


def _steps(env, n):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n):
            out = env.step({0: 2, 1: 2})
    return out, [w for w in caught if "infos without agent" in str(w.message)]


def test_multigrid_steps_with_its_empty_infos_and_one_warning_per_env(mission_codec):
    first, second = emulate(MultiGridEmpty(agents=2)), emulate(MultiGridEmpty(agents=2))
    for env in (first, second):
        env.reset(seed=0)
        (_, rewards, _, _, infos), warned = _steps(env, 4)
        assert infos == {0: {}, 1: {}} and rewards.shape == (2,)
        assert len(warned) == 1, [str(w.message) for w in warned]
        assert "infos without agent 0" in str(warned[0].message) and "reads as {}" in str(warned[0].message)


def test_multigrid_through_as_pettingzoo_and_a_vector_backend(mission_codec):
    env = as_pettingzoo(emulate(MultiGridEmpty(agents=2)))
    env.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _, rewards, term, trunc, infos = env.step({0: 2, 1: 2})
        assert infos == {0: {}, 1: {}} and set(rewards) == set(term) == set(trunc) == {0, 1}
        vec = make_vector(lambda: MultiGridEmpty(agents=2), 2, backend="serial")
        try:
            vec.reset(seed=0)
            for _ in range(3):  # one action per row: 2 envs x 2 agents
                *_, infos = vec.step(np.full(vec.action_space.shape, 2))
            assert infos == [{0: {}, 1: {}}, {0: {}, 1: {}}]
        finally:
            vec.close()


class _Missing(ParallelEnv):
    """Two agents; ``drop`` names the step output that leaves agent "b" out."""

    metadata = {"name": "missing_v0"}

    def __init__(self, drop):
        self.drop, self.possible_agents = drop, ["a", "b"]

    def observation_space(self, agent):
        return spaces.Box(0, 1, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        out = [{a: np.zeros(2, np.float32) for a in self.agents}, {a: 1.0 for a in self.agents},
               {a: False for a in self.agents}, {a: False for a in self.agents}, {a: {} for a in self.agents}]
        del out[self.drop]["b"]
        return tuple(out)


@pytest.mark.parametrize("drop, name", [(1, "rewards"), (2, "terminations"), (3, "truncations")])
def test_a_missing_reward_or_flag_is_still_refused(drop, name):
    env = emulate(_Missing(drop))
    env.reset(seed=0)
    with pytest.raises(EmulationError, match=f"step\\(\\) returned {name} without agent 'b', which was alive"):
        env.step({"a": 0, "b": 1})


def test_a_missing_info_of_a_toy_env_reads_as_empty():
    env = emulate(_Missing(4))
    env.reset(seed=0)
    (*_, infos), warned = _steps_named(env)
    assert infos == {"a": {}, "b": {}} and len(warned) == 1


def _steps_named(env):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = env.step({"a": 0, "b": 1})
    return out, [w for w in caught if "infos without agent 'b'" in str(w.message)]


@pytest.mark.parametrize("actions", [[0, 0], (0, 0), np.zeros(2, np.int64)])
def test_as_pettingzoo_refuses_a_batch_where_a_parallel_env_takes_a_dict(actions):
    env = as_pettingzoo(emulate(_Missing(4)))
    env.reset(seed=0)
    with pytest.raises(UsageError, match=r"a PettingZoo ParallelEnv takes a dict \{agent: action\}"):
        env.step(actions)
