"""The rollout's rooms: ``RolloutStorage`` (the only writer of its buffers), the peer drivers over it, and the
CUDA-graph wrapper's fallback to the eager step."""
import warnings

import pytest
import torch

from packrl import vector
from packrl.models import Policy
from packrl.train.graphs import StepGraphs
from packrl.train.ppo import PPO, PPOConfig

STORAGE = ("obs", "masks", "starts", "rewards", "terminals", "truncations", "actions", "logprobs", "values",
           "final_values", "next_value")


def _collected(force_graphs: bool, network: str = "mlp") -> tuple[PPO, list[warnings.WarningMessage]]:
    env = vector.make("cartpole", 8, backend="numba", seed=0, max_episode_steps=9)
    torch.manual_seed(0)
    ppo = PPO(env, Policy.from_env(env, network=network, hidden=16), PPOConfig(num_steps=16, seed=0, device="cpu"))
    if force_graphs:  # asked for graphs where capture cannot work (no CUDA stream on this device): it must fall back
        ppo.graphs = StepGraphs(wanted=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ppo.collect()
            ppo.update()
        ppo.collect()
    env.close()
    return ppo, [w for w in caught if "CUDA-graph" in str(w.message)]


@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_a_failed_capture_falls_back_to_the_eager_step_with_one_warning(network):
    eager, none = _collected(False, network)
    fell_back, warned = _collected(True, network)
    assert none == [] and len(warned) == 1, [str(w.message) for w in warned]  # one line, and no second try
    assert "eager" in str(warned[0].message) and not fell_back.graphs.captured
    assert eager.truncations.any(), "episodes must be truncated inside the rollout"
    for name in STORAGE:
        assert torch.equal(getattr(eager, name), getattr(fell_back, name)), name


def test_eager_steps_are_the_default_on_every_device():
    assert PPOConfig().cuda_graphs is False
