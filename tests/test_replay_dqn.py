"""examples/dqn_structured.py learns through the replay buffer: a short run (bounded by env steps, no timing)
must lift the greedy return well above a random policy's, and the same run with the sampled n-step returns
zeroed must not (so the check can fail)."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from packrl.envs.gridworld import RANDOM_RETURN

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dqn_structured.py"


@pytest.fixture(scope="module")
def dqn():
    spec = importlib.util.spec_from_file_location("dqn_structured", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _short(dqn, **overrides):
    torch.set_num_threads(1)
    config = dqn.Config(total_steps=6_000, learning_starts=500, epsilon_fraction=0.5, eval_every=6_000,
                        eval_episodes=64, seed=0, **overrides)
    return dqn.train(config, log=lambda line: None)


@pytest.mark.parametrize("prioritized", [False, True])
def test_dqn_learns_well_above_random(dqn, prioritized):
    result = _short(dqn, prioritized=prioritized)
    assert result["final"] > RANDOM_RETURN + 0.5, result["history"]


def test_dqn_fails_when_the_targets_lose_the_rewards(dqn, monkeypatch):
    """The check above can fail: zeroing the sampled returns leaves the policy no better than chance."""
    from packrl.train.replay import ReplayBuffer

    sample = ReplayBuffer.sample

    def rewardless(self, *args, **kwargs):
        batch = sample(self, *args, **kwargs)
        batch.returns = batch.returns * 0
        return batch

    monkeypatch.setattr(ReplayBuffer, "sample", rewardless)
    result = _short(dqn)
    assert result["final"] < RANDOM_RETURN + 0.5, result["history"]
