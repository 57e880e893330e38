"""aim: a Numba env with a MultiDiscrete observation leaf and a hybrid action (Discrete plus Box). Its random and
greedy reference returns are measured here; the kernel sees the leaves by name and the hybrid action's parts."""
import numpy as np
import pytest

import packrl.envs as envs
from packrl import vector
from packrl.envs import aim
from packrl.errors import EmulationError


def mean_return(env, policy, steps=1500):
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    returns = []
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(policy(env, rng))
        returns += env.episode_returns[terminated | truncated].tolist()
    return float(np.mean(returns))


def random_policy(env, rng):
    return {"discrete": rng.integers(0, 4, (env.num_envs, 1)), "continuous": rng.random((env.num_envs, 1)).astype(np.float32)}


def greedy_policy(env, rng):
    target, pos = env.leaf_views["target"].astype(float), env.leaf_views["position"].astype(float)
    dr, dc = target[:, 0] - pos[:, 0], target[:, 1] - pos[:, 1]
    heading = np.where(np.abs(dr) >= np.abs(dc), np.where(dr < 0, 0, 2), np.where(dc > 0, 1, 3))
    speed = np.minimum(np.maximum(np.abs(dr), np.abs(dc)), 1.0).astype(np.float32)
    return {"discrete": heading[:, None], "continuous": speed[:, None]}


def test_spaces_reach_every_head():
    env = vector.make("aim", 4, backend="numba")
    assert env.emulated.action.kind == "hybrid"
    assert {leaf.path for leaf in env.emulated.observation.leaves} == {("target",), ("position",)}
    assert env.leaf_views["target"].dtype == np.int64 and env.leaf_views["position"].dtype == np.float32


def test_random_and_greedy_reference_returns():
    env = envs.make("aim", num_envs=128, seed=0)
    random_return, greedy_return = mean_return(env, random_policy), mean_return(env, greedy_policy)
    assert random_return == pytest.approx(aim.RANDOM_RETURN, abs=0.15)
    assert greedy_return == pytest.approx(aim.GREEDY_RETURN, abs=0.3)


def test_a_speed_outside_its_box_is_refused():
    env = envs.make("aim", num_envs=2)
    env.reset()
    with pytest.raises(EmulationError, match="env index 1"):
        env.step({"discrete": np.zeros((2, 1), np.int64), "continuous": np.array([[0.5], [1.5]], np.float32)})


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_defaults_learn_aim(seed):
    """PPO with default settings, 200k agent steps on 16 copies: the greedy policy passes LEARNED_THRESHOLD
    (random -0.3, greedy shortest way 4.1); the hybrid head (Discrete plus Box) learns both parts."""
    import torch

    from packrl.models import Policy
    from packrl.train.evaluate import evaluate
    from packrl.train.ppo import PPO, PPOConfig

    torch.manual_seed(seed)
    env = vector.make("aim", 16, backend="numba", seed=seed)
    policy = Policy.from_env(env)
    PPO(env, policy, PPOConfig(seed=seed)).train(200_000)
    returns = evaluate(policy, vector.make("aim", 32, backend="numba", seed=999), deterministic=True)
    assert returns.mean() >= aim.LEARNED_THRESHOLD
