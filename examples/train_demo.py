"""The main demo: train PPO on packrl's structured Numba gridworld (no download), then show the
learning curve and where the checkpoint is. About 2-3 minutes on 2 CPU cores.

    python examples/train_demo.py [--total-steps 60000] [--out runs/demo]

The same run from the command line: ``packrl train gridworld --num-envs 32 --total-steps 60000``.
"""
from __future__ import annotations

import argparse
import sys

from packrl.commands.evaluate import eval_command
from packrl.commands.train import train_command
from packrl.envs.gridworld import LEARNED_THRESHOLD, RANDOM_RETURN
from packrl.train.run import merge_config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-steps", type=int, default=60_000)
    parser.add_argument("--out", default="runs/demo")
    args = parser.parse_args()
    config = merge_config({
        "env": {"id": "gridworld"},
        "vec": {"backend": "numba", "num_envs": 32},
        "policy": {"network": "mlp", "hidden": 64},
        "train": {"total_steps": args.total_steps, "num_steps": 32, "learning_rate": 2e-3, "ent_coef": 0.01,
                  "update_epochs": 4, "num_minibatches": 4, "gamma": 0.95, "seed": 0},
    })
    print(f"gridworld: a random policy scores about {RANDOM_RETURN}, a learned one above {LEARNED_THRESHOLD}")
    rc = train_command(config, args.out)
    if rc == 0:
        eval_command(f"{args.out}/checkpoint", episodes=64)
    return rc


if __name__ == "__main__":
    sys.exit(main())
