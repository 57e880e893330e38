"""simple_tag learned by one policy per group (issue 40): packrl's defaults against random play, on mpe2's own env.

simple_tag's predators (3 adversaries, 16 floats each) and prey (1 agent, 14 floats) have different observation
spaces, so ``packrl train simple_tag`` trains a GroupedPolicy: one policy per group, in one PPO. Each run trains the
Numba port (``packrl train simple_tag --seed S``: its preset, built and trained as the session does), then each
group is judged on mpe2's ``simple_tag_v3`` (``vector.make``, serial): its greedy policy against a uniformly random
other group, mean per-agent episode return over 96 episodes, beside random play for both. Co-trained groups can
stall each other; against a random opponent a group shows what it learned: predators that chase, prey that flees
and keeps inside the arena (mpe2 penalizes the prey for leaving it).

    .venv/bin/python benchmarks/tag_learning.py [--seeds 3] [--first-seed 0] [--steps 1000000] [--preset auto]
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

from mpe2 import simple_tag_v3  # noqa: E402

from packrl import config as settings  # noqa: E402
from packrl import vector  # noqa: E402
from packrl.train.run import build_ppo  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, print_table  # noqa: E402

STEPS = 1_000_000
EPISODES = 96
GROUPS = ("predators", "prey")


@torch.no_grad()
def against_random(policy: torch.nn.Module | None, group: int, episodes: int = EPISODES, seed: int = 1000) -> float:
    """Mean per-agent episode return of ``group`` on mpe2's simple_tag_v3, its rows acting greedily by ``policy``
    (None: at random), every other row at random."""
    env = vector.make(lambda: simple_tag_v3.parallel_env(), 8, backend="serial", seed=seed)
    agents = len(env.emulated.agents)
    group_of_row = np.array([env.emulated.row_group[r % agents] for r in range(env.num_agents)])
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    running, finished = np.zeros(env.num_agents), []
    try:
        while len(finished) < episodes * int((group_of_row[:agents] == group).sum()):
            actions = rng.integers(0, 5, env.num_agents)
            if policy is not None:
                logits, _, _ = policy.forward_eval(torch.as_tensor(obs))
                greedy = np.asarray(policy.decoder.to_numpy(policy.decoder.distribution(logits).mode())).reshape(-1)
                actions = np.where(group_of_row == group, greedy, actions)
            obs, rewards, terminals, truncations, _ = env.step(actions)
            running += rewards
            ended = terminals | truncations
            finished.extend(running[ended & (group_of_row == group)])
            running[ended] = 0.0
    finally:
        env.close()
    return float(np.mean(finished))


def train(seed: int, steps: int, preset: str = "auto") -> tuple[torch.nn.Module, str]:
    """``packrl train simple_tag --seed S --total-steps STEPS`` as the session builds it: (policy, preset name)."""
    config, chosen = settings.resolve(flags={"env": {"id": "simple_tag"}, "train": {"seed": seed, "total_steps": steps}},
                                      preset=preset)
    ppo = build_ppo(config)
    try:
        ppo.train(steps)
    finally:
        ppo.env.close()
    return ppo.policy, chosen.name if chosen else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--preset", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_line(("mpe2",)), flush=True)
    random = [against_random(None, g) for g in range(len(GROUPS))]
    print("random play: " + ", ".join(f"{name} {value:.2f}" for name, value in zip(GROUPS, random)), flush=True)
    rows, results = [], [[] for _ in GROUPS]
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        start = time.perf_counter()
        policy, preset = train(seed, args.steps, args.preset)
        seconds = time.perf_counter() - start
        values = [against_random(policy, g) for g in range(len(GROUPS))]
        for g, value in enumerate(values):
            results[g].append(value)
        rows.append([seed, preset, *values, seconds])
        print(f"  seed {seed} ({preset}): " + ", ".join(f"{name} {v:.2f}" for name, v in zip(GROUPS, values)) +
              f", {seconds:.0f} s", flush=True)
    print_table(f"simple_tag, {args.steps:,} agent steps, greedy against a random other group over {EPISODES} "
                "episodes of mpe2's env", ["seed", "preset", *GROUPS, "train s"], rows)
    print_table("medians", ["group", "random play", "median", "min", "max"],
                [[name, random[g], statistics.median(results[g]), min(results[g]), max(results[g])]
                 for g, name in enumerate(GROUPS)])


if __name__ == "__main__":
    main()
