"""Torch ops dispatched per rollout step (issue 27): each is a kernel launch on a GPU, so their count is the
rollout's host overhead, measured the same on any machine. PPO.collect with the default policy on 64 Numba
gridworlds must stay at or under 40 per step (98.6 before the rollout was restructured)."""
import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from packrl import vector
from packrl.models import Policy
from packrl.train.ppo import PPO, PPOConfig

GOAL = 40


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(env_id: str, steps: int = 16, **policy) -> tuple[float, collections.Counter]:
    torch.manual_seed(0)
    env = vector.make(env_id, 64, backend="numba", seed=0)
    try:
        ppo = PPO(env, Policy.from_env(env, **policy), PPOConfig(num_steps=steps, device="cpu"))
        ppo.collect()  # the first rollout allocates what later ones reuse
        count = CountOps()
        with count:
            ppo.collect()
    finally:
        env.close()
    return sum(count.names.values()) / steps, count.names


@pytest.mark.parametrize("steps", [16, 128])
def test_default_policy_on_the_numba_gridworld_stays_within_the_goal(steps):
    per_step, names = ops_per_step("gridworld", steps, hidden=128)
    top = ", ".join(f"{k} {v / steps:.1f}" for k, v in names.most_common(8))
    assert per_step <= GOAL, f"{per_step:.1f} torch ops per rollout step (goal <= {GOAL}); top: {top}"
    assert names["conv2d"] == 0, "the 5x5 image is read by the flat encoder, not a conv trunk"


def test_the_count_sees_the_policy():
    """The counter is not blind: a bigger network (an LSTM core, a separate critic) costs more ops per step."""
    mlp, _ = ops_per_step("gridworld", hidden=32)
    lstm, names = ops_per_step("gridworld", network="lstm", hidden=32)
    assert lstm > mlp + 5 and names["sigmoid"] > 0
