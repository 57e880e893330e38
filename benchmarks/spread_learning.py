"""simple_spread learned in 65,536 agent steps: packrl's defaults against SB3 PPO through `as_sb3` (issue 40).

Contenders, one after the other in this process, each with one torch thread, per seed:
- ``sb3``: SB3 PPO on mpe2's ``simple_spread_v3`` through ``as_sb3(vector.make(spread, 8))`` with the settings of
  tests/test_compat_sb3.py (n_steps 64, batch 256, 10 epochs, lr 1e-3, gamma 0.95, no entropy bonus);
- ``packrl-numba``: ``packrl train simple_spread --seed S`` (the Numba port; the config from
  ``packrl.config.resolve``, so its preset), built and trained as the session does;
- ``packrl-mpe2``: the same on ``mpe2.simple_spread_v3`` (emulated, serial backend).

Every contender's policy is judged the same way: the greedy per-agent episode return over 96 episodes of mpe2's
own env (``as_sb3(vector.make(spread, 4, seed=1000))``, SB3's ``evaluate_policy``), beside a uniformly random
policy on the same episodes. Prints one row per run, then medians, and the machine.

    .venv/bin/python benchmarks/spread_learning.py [--seeds 3] [--first-seed 0] [--contenders sb3,packrl-numba,...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore", category=DeprecationWarning)

from mpe2 import simple_spread_v3  # noqa: E402
from stable_baselines3 import PPO as SB3PPO  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

from packrl import config as settings  # noqa: E402
from packrl import vector  # noqa: E402
from packrl.compat.sb3 import as_sb3  # noqa: E402
from packrl.train.run import build_ppo  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, print_table  # noqa: E402

BUDGET = 65_536
EPISODES = 96
CONTENDERS = ("sb3", "packrl-numba", "packrl-mpe2")


def spread():
    return simple_spread_v3.parallel_env(N=3)


class RandomPolicy:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def predict(self, obs, state=None, episode_start=None, deterministic=False):
        return self.rng.integers(0, 5, len(obs)), None


class GreedyPacked:
    """A packrl policy in SB3's ``predict`` form: the most likely action for each row."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        with torch.no_grad():
            logits, _, _ = self.policy.forward_eval(torch.as_tensor(np.asarray(obs, np.float32)))
            return self.policy.decoder.to_numpy(self.policy.decoder.distribution(logits).mode()), None


def judge(model) -> float:
    evaluation = as_sb3(vector.make(spread, 4, seed=1000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SB3 asks for its Monitor wrapper; the episodes are MPE's own
        mean, _ = evaluate_policy(model, evaluation, n_eval_episodes=EPISODES, deterministic=True)
    evaluation.close()
    return float(mean)


def sb3(seed: int):
    env = as_sb3(vector.make(spread, 8, seed=seed))
    model = SB3PPO("MlpPolicy", env, n_steps=64, batch_size=256, n_epochs=10, learning_rate=1e-3, gamma=0.95,
                   ent_coef=0.0, seed=seed, device="cpu")
    model.learn(BUDGET)
    env.close()
    return model, "SB3 settings of tests/test_compat_sb3.py"


def packrl(env_id: str, seed: int):
    config, preset = settings.resolve(flags={"env": {"id": env_id}, "train": {"seed": seed, "total_steps": BUDGET}})
    ppo = build_ppo(config)
    ppo.train(BUDGET)
    ppo.env.close()
    return GreedyPacked(ppo.policy), f"preset {preset.name if preset else 'none'}"


RUNS = {"sb3": sb3, "packrl-numba": lambda seed: packrl("simple_spread", seed),
        "packrl-mpe2": lambda seed: packrl("mpe2.simple_spread_v3", seed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    args = parser.parse_args()
    contenders = args.contenders.split(",")
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}; known: {list(CONTENDERS)}")
    torch.set_num_threads(1)
    print(machine_line(("stable_baselines3", "mpe2")), flush=True)
    random_return = judge(RandomPolicy(0))
    print(f"random policy: {random_return:.2f} (greedy per-agent episode return over {EPISODES} episodes)", flush=True)
    rows, results = [], {name: [] for name in contenders}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name in contenders:
            start = time.perf_counter()
            model, how = RUNS[name](seed)
            seconds = time.perf_counter() - start
            value = judge(model)
            results[name].append(value)
            rows.append([name, seed, how, value, value - random_return, seconds])
            print(f"  {name} seed {seed}: greedy {value:.2f} ({value - random_return:+.2f} over random), "
                  f"{seconds:.0f} s", flush=True)
    print_table(f"simple_spread, {BUDGET:,} agent steps, greedy over {EPISODES} episodes of mpe2's env",
                ["contender", "seed", "settings", "greedy return", "over random", "train s"], rows)
    print_table("medians", ["contender", "median greedy", "min", "max", "median over random"],
                [[name, statistics.median(v), min(v), max(v), statistics.median(v) - random_return]
                 for name, v in results.items()])


if __name__ == "__main__":
    main()
