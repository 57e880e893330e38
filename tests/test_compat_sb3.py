"""packrl.compat.sb3: a packrl vector env as a Stable-Baselines3 VecEnv. SB3 PPO learns CartPole through
it (rl-zoo hyperparameters); a Dict-observation env reaches MultiInputPolicy as a Dict of its exact
leaves (int64 beyond float precision kept in SB3's rollout buffer), with terminal_observation and
TimeLimit.truncated as SB3's own VecEnvs give them; env attributes and refusals."""
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy

from packrl import UsageError, vector
from packrl.compat.sb3 import as_sb3
from packrl.vector.testing import ScriptedEnv

BIG_SEED = 2**53 + 1  # not a float64 (nor float32): an int64 leaf that passed through a float would change


def cartpole():
    return gymnasium.make("CartPole-v1")


def test_sb3_ppo_learns_cartpole_through_the_adapter():
    """rl-zoo's CartPole-v1 PPO settings, 32,768 steps (bounded by steps; rl-zoo trains 100k): greedy
    evaluation must reach CartPole-v1's reward threshold of 475 (a random policy gets about 22)."""
    torch.set_num_threads(1)
    env = as_sb3(vector.make(cartpole, 8, seed=0))
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=lambda f: 1e-3 * f, clip_range=lambda f: 0.2 * f, seed=0, device="cpu")
    model.learn(32_768)
    evaluation = as_sb3(vector.make(cartpole, 4, seed=1000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SB3 asks for its Monitor wrapper; the episodes are CartPole's own
        mean, _ = evaluate_policy(model, evaluation, n_eval_episodes=8, deterministic=True)
    env.close()
    evaluation.close()
    assert mean >= 475, f"mean greedy return {mean} after 32,768 steps"


def test_dict_observation_reaches_sb3_as_exact_leaves():
    venv = vector.make(ScriptedEnv, 4, seed=BIG_SEED)
    env = as_sb3(venv)
    assert isinstance(env.observation_space, spaces.Dict)
    assert set(env.observation_space) == {"seed", "episode", "t", "last_action", "noise"}
    assert env.observation_space["seed"].dtype == np.int64 and env.observation_space["noise"].dtype == np.float64
    layout = venv.emulated.observation
    obs = env.reset()
    assert obs["seed"].dtype == np.int64 and obs["seed"][:, 0].tolist() == [BIG_SEED + i for i in range(4)]
    ended = {"terminated": 0, "truncated": 0}
    for _ in range(20):
        before, kept = obs, {key: value.copy() for key, value in obs.items()}
        obs, rewards, dones, infos = env.step(np.ones(4, np.int64))
        for key in kept:  # copies: what SB3 keeps is not overwritten by the next step
            np.testing.assert_array_equal(before[key], kept[key])
        native = layout.unpack(venv.observations)
        np.testing.assert_array_equal(obs["noise"], native["noise"])
        np.testing.assert_array_equal(obs["t"], native["t"])
        for i, info in enumerate(infos):
            truncated = bool(venv.truncations[i] and not venv.terminals[i])
            assert info["TimeLimit.truncated"] is truncated
            if dones[i]:
                final = info["terminal_observation"]
                assert final["t"] == before["t"][i] + 1 and final["seed"].tolist() == [BIG_SEED + i]
                assert obs["t"][i] == 0  # the next episode's first observation
                ended["truncated" if truncated else "terminated"] += 1
            else:
                assert "terminal_observation" not in info
    assert ended["terminated"] and ended["truncated"], ended

    # no seed here: SB3 would reseed the envs with 0..3 (as it should); the envs keep the big seeds
    model = PPO("MultiInputPolicy", env, n_steps=16, batch_size=32, n_epochs=1, device="cpu")
    model.learn(64)
    stored = model.rollout_buffer.observations["seed"]
    assert stored.dtype == np.int64
    assert set(stored.reshape(-1).tolist()) == {BIG_SEED + i for i in range(4)}
    env.close()


class MatchEnv(gymnasium.Env):
    """Reward 1 when the action equals the observed Discrete target; a Dict observation with an int16
    distractor. Episodes of 16 steps (truncated)."""

    def __init__(self):
        self.observation_space = spaces.Dict({"target": spaces.Discrete(4),
                                              "distractor": spaces.Box(0, 9, (2,), np.int16)})
        self.action_space = spaces.Discrete(4)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(action == self.target)
        self.t += 1
        return self._obs(), reward, False, self.t >= 16, {}

    def _obs(self):
        self.target = int(self.np_random.integers(4))
        return {"target": self.target, "distractor": self.np_random.integers(0, 10, 2).astype(np.int16)}


def test_multi_input_policy_learns_from_the_leaves():
    """The Discrete leaf reaches the policy as a one-hot (not as a byte of a float row): PPO learns to
    match it (random: 0.25 per step)."""
    torch.set_num_threads(1)
    env = as_sb3(vector.make(MatchEnv, 8, seed=0))
    model = PPO("MultiInputPolicy", env, n_steps=32, batch_size=128, n_epochs=4, learning_rate=3e-3, seed=0,
                device="cpu")
    model.learn(8192)
    evaluation = as_sb3(vector.make(MatchEnv, 4, seed=500))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mean, _ = evaluate_policy(model, evaluation, n_eval_episodes=8, deterministic=True)
    assert mean >= 14, f"mean return {mean} of 16"


def test_attributes_through_the_adapter():
    env = as_sb3(vector.make(lambda: gymnasium.make("CartPole-v1", render_mode="rgb_array"), 3))
    env.reset()
    assert env.render_mode == "rgb_array"
    assert env.get_attr("gravity") == [9.8] * 3
    env.set_attr("gravity", 3.0, indices=[1])
    assert env.get_attr("gravity") == [9.8, 3.0, 9.8]
    assert env.get_attr("gravity", indices=[1, 2]) == [3.0, 9.8]
    assert env.env_method("get_wrapper_attr", "force_mag", indices=0) == [10.0]
    from gymnasium.wrappers import TimeLimit
    assert env.env_is_wrapped(TimeLimit) == [True] * 3
    assert env.env_is_wrapped(gymnasium.wrappers.RecordVideo) == [False] * 3
    images = env.get_images()
    assert len(images) == 3 and images[0].ndim == 3
    with pytest.raises(UsageError, match="env_method\\('step'\\)"):
        env.env_method("step", 0)
    env.close()


def test_refused_vector_envs():
    with pytest.raises(UsageError, match="infos='list'"):
        as_sb3(vector.make(cartpole, 2, infos="dict"))
    with pytest.raises(UsageError, match="batch_size=1 < num_envs=2"):
        as_sb3(vector.make(cartpole, 2, batch_size=1))
    with pytest.raises(UsageError, match="observations='rows'"):
        as_sb3(vector.make(cartpole, 2), observations="leaves")
    import minigrid  # noqa: F401 - registers the MiniGrid ids

    minigrid_envs = vector.make(lambda: gymnasium.make("MiniGrid-Empty-5x5-v0"), 2)
    with pytest.raises(UsageError, match="leaf 'mission'.*skip=\\('mission',\\)"):
        as_sb3(minigrid_envs)
    with pytest.raises(UsageError, match="no observation leaf \\['colour'\\]"):
        as_sb3(minigrid_envs, skip=("colour",))
    env = as_sb3(minigrid_envs, skip=("mission",))
    assert set(env.observation_space) == {"image", "direction"}
    assert env.reset()["image"].dtype == np.uint8
    env.close()
    with pytest.raises(UsageError, match="as_sb3 takes a packrl vector env"):
        as_sb3(gymnasium.make("CartPole-v1"))

    class ShiftedDiscrete(ScriptedEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = spaces.Dict({**self.observation_space.spaces, "t": spaces.Discrete(16, start=1)})

    with pytest.raises(UsageError, match="observation leaf 't'.*start=1"):
        as_sb3(vector.make(ShiftedDiscrete, 2))
