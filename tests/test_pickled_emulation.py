"""An emulated env survives pickling (SuperSuit's vector recipes cloudpickle the env they are given; spawn and
Ray send creators, but users copy envs too): the copy writes its rows into its own buffers, the ones it returns,
and steps exactly as the original."""
import copy
import pickle

import gymnasium as gym
import minigrid  # noqa: F401 - registers the MiniGrid ids
import numpy as np
import pytest
from mpe2 import simple_spread_v3

from packrl.emulation import emulate

MAKERS = {
    "cartpole": lambda: gym.make("CartPole-v1"),
    "minigrid-dict": lambda: gym.make("MiniGrid-Empty-5x5-v0"),
    "mpe-parallel": lambda: simple_spread_v3.parallel_env(max_cycles=10),
}


@pytest.mark.parametrize("copier", [lambda e: pickle.loads(pickle.dumps(e)), copy.deepcopy], ids=["pickle", "deepcopy"])
@pytest.mark.parametrize("name", list(MAKERS))
def test_a_copy_steps_as_the_original_into_its_own_rows(name, copier):
    env = emulate(MAKERS[name]())
    twin = copier(env)
    assert twin.observations is not env.observations
    first, _ = env.reset(seed=3)
    again, _ = twin.reset(seed=3)
    assert again.any() and np.array_equal(first, again)
    assert np.shares_memory(again, twin.observations) or np.array_equal(again, twin.observations)
    rng = np.random.default_rng(0)
    for _ in range(12):
        if env.done:
            env.reset(seed=4), twin.reset(seed=4)
        action = np.stack([env.single_action_space.sample() for _ in range(env.num_agents)]) \
            if name == "mpe-parallel" else np.array([rng.integers(env.single_action_space.n)])
        a, b = env.step(action), twin.step(action.copy())
        for x, y in zip(a[:4], b[:4]):
            assert np.array_equal(x, y)
        assert np.array_equal(env.observations, twin.observations)
        assert env.done or twin.observations.any()  # an ended episode's rows are zeroed
