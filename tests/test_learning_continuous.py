"""`packrl train` on continuous actions: the pendulum preset learns, and its observation statistics travel.

The runs are what ``packrl train Pendulum-v1`` resolves (``packrl.config.resolve``: defaults < the pendulum
preset), built as the session builds them. benchmarks/learning.py --continuous measures them over seeds, with
SB3 zoo and a CleanRL-style ppo_continuous_action loop side by side."""
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from packrl import cli, vector
from packrl import config as settings
from packrl.train.evaluate import evaluate
from packrl.train.run import build_ppo, save

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SEED = 10_000  # packrl eval's default seed


def train_with_defaults(env_id: str, steps: int, seed: int = 0, policy: dict | None = None):
    flags = {"env": {"id": env_id}, "train": {"seed": seed, "total_steps": steps}, "policy": policy or {}}
    config, preset = settings.resolve(flags=flags)
    ppo = build_ppo(config)
    history = ppo.train(steps)
    ppo.env.close()
    return ppo, config, history, preset


def pendulums(n: int) -> object:
    """The envs ``packrl eval`` builds for a Pendulum-v1 checkpoint: ``n`` serial gymnasium envs, seeded alike."""
    return vector.make(lambda: gym.make("Pendulum-v1"), n, backend="serial", seed=SEED)


def eval_table(output: str) -> dict[str, float]:
    """``{"sampled": mean, "greedy": mean}`` from ``packrl eval``'s table."""
    found = dict(re.findall(r"^\W*(sampled|greedy)\b[^\d-]*?(-?\d+\.\d+)", output, re.MULTILINE))
    return {mode: float(value) for mode, value in found.items()}


@pytest.mark.parametrize("normalize", [False, True], ids=["preset", "normalized-observations"])
def test_packrl_eval_plays_the_runs_policy(tmp_path, capsys, normalize):
    """A 4,096-step pendulum run (the preset; then with ``--set policy.normalize_observations=true``, which the
    continuous-control preset sets), saved as ``packrl train`` saves it: ``packrl eval`` reports, in both modes,
    the returns the run's own policy gets on the same envs. With normalization, its statistics came with the
    weights, and they matter (the same weights without them score differently)."""
    ppo, config, history, preset = train_with_defaults("Pendulum-v1", 4096,
                                                       policy={"normalize_observations": True} if normalize else None)
    assert preset.name == "pendulum"
    encoder = ppo.policy.encoder
    assert encoder.normalize == normalize
    checkpoint = save(ppo, config, tmp_path / "checkpoint", history)
    episodes = 8
    own = {mode: float(evaluate(ppo.policy, pendulums(episodes), deterministic=mode == "greedy", seed=SEED,
                                episodes=episodes).mean()) for mode in ("sampled", "greedy")}

    assert cli.main(["eval", str(checkpoint), "--episodes", str(episodes)]) == 0
    reported = eval_table(capsys.readouterr().out)
    assert reported.keys() == own.keys(), reported
    for mode in own:  # to the table's precision: 3 decimals below 100, 1 above (the table fits 80 columns)
        shown = len(str(reported[mode]).partition(".")[2])
        assert reported[mode] == pytest.approx(own[mode], abs=0.5 * 10 ** -min(shown, 3) + 1e-9), (mode, reported, own)
    if not normalize:
        return

    assert float(encoder.obs_count) > 0 and torch.any(encoder.obs_mean != 0)
    with torch.no_grad():  # the same weights, the statistics reset: another policy on the same envs
        encoder.obs_mean.zero_()
        encoder.obs_var.fill_(1.0)
        encoder.refresh_normalization()
    plain = float(evaluate(ppo.policy, pendulums(episodes), deterministic=True, seed=SEED, episodes=episodes).mean())
    assert plain != pytest.approx(own["greedy"], abs=1e-3)


@pytest.mark.slow
def test_pendulum_defaults_learn_within_100k_steps():
    """`packrl train Pendulum-v1` as it is (the pendulum preset, 100k agent steps): a 20-episode greedy eval of
    at least -250 (random play is about -1,200; benchmarks/README.md's continuous table has the seeds)."""
    ppo, _, _, preset = train_with_defaults("Pendulum-v1", 100_000)
    assert preset.name == "pendulum"
    returns = evaluate(ppo.policy, pendulums(20), deterministic=True, seed=SEED, episodes=20)
    assert np.mean(returns) >= -250, returns
