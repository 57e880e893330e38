"""packrl.compat.gymnasium.as_gymnasium: a single-agent emulate(env) as a gymnasium.Env that passes
gymnasium's and SB3's env checkers (Dict, Box, MiniGrid and hybrid-action envs), whose observations are
the packed rows (unpacked: the native observation, bit for bit), and that SB3 accepts; PettingZoo and
batched envs are refused with what to use instead."""
import warnings

import gymnasium
import minigrid  # noqa: F401 - registers the MiniGrid ids
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from packrl import UsageError
from packrl.compat.gymnasium import as_gymnasium
from packrl.emulation import emulate
from packrl.vector.testing import ScriptedEnv


class HybridEnv(gymnasium.Env):
    """A Dict action of a shifted Discrete and a Box: the view offers packrl's hybrid policy space."""

    observation_space = spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Box(-1, 1, (2,), np.float32)})
    action_space = spaces.Dict({"move": spaces.Discrete(4, start=-1), "force": spaces.Box(-2, 2, (2,), np.float32)})

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        assert -1 <= action["move"] <= 2 and action["force"].dtype == np.float32, action
        return self._obs(), float(action["move"]), False, False, {}

    def _obs(self):
        return {"a": int(self.np_random.integers(3)), "b": self.np_random.uniform(-1, 1, 2).astype(np.float32)}


CREATORS = {
    "ScriptedDict": ScriptedEnv,
    "CartPole": lambda: gymnasium.make("CartPole-v1"),
    "MiniGrid": lambda: gymnasium.make("MiniGrid-Empty-5x5-v0"),
    "HybridActions": HybridEnv,
}


@pytest.mark.parametrize("name", CREATORS)
def test_check_env_passes(name):
    env = as_gymnasium(emulate(CREATORS[name]()))
    assert isinstance(env, gymnasium.Env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # checker advice (e.g. CartPole's unbounded Box), not failures
        check_env(env, skip_render_check=True)
        from stable_baselines3.common.env_checker import check_env as sb3_check_env

        sb3_check_env(env)
    env.close()


def test_observations_are_the_packed_rows_of_the_native_observations():
    raw = ScriptedEnv()
    twin = ScriptedEnv()  # stepped raw with the same seed and actions
    env = as_gymnasium(raw)
    assert env.observation_space == spaces.Box(0, 255, (env.layout.nbytes,), np.uint8)
    obs, _ = env.reset(seed=2**40)
    native, _ = twin.reset(seed=2**40)
    for t in range(12):
        unpacked = env.layout.unpack(obs)
        for key in native:
            assert np.array_equal(unpacked[key], native[key]), (t, key)
        before = obs.copy()
        obs, reward, terminated, truncated, _ = env.step(2)
        native, twin_reward, twin_terminated, twin_truncated, _ = twin.step(2)
        assert np.array_equal(before, env.layout.pack(env.layout.unpack(before)))
        # packrl's reward buffer is float32 (DESIGN.md): the env's reward rounded once
        assert (reward, terminated, truncated) == (float(np.float32(twin_reward)), twin_terminated, twin_truncated)
        assert type(reward) is float and type(terminated) is bool
        if terminated or truncated:
            obs, _ = env.reset()
            native, _ = twin.reset()


def test_sb3_takes_the_view():
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", as_gymnasium(gymnasium.make("CartPole-v1")), n_steps=32, batch_size=32, n_epochs=1,
                device="cpu")
    model.learn(64)
    assert model.num_timesteps == 64


def test_envs_without_a_gymnasium_form_are_refused():
    from mpe2 import simple_spread_v3

    with pytest.raises(UsageError, match="3 rows.*packrl.vector.make"):
        as_gymnasium(emulate(simple_spread_v3.parallel_env()))
    from packrl import vector

    with pytest.raises(UsageError, match="resets itself"):
        as_gymnasium(vector.make("cartpole", 2, backend="numba"))
    with pytest.raises(UsageError, match="as_gymnasium takes emulate"):
        as_gymnasium("CartPole-v1")
