"""The main demo: train PPO on packrl's structured Numba gridworld (no download), then evaluate the
checkpoint and show where the run folder, learning curve and checkpoint are.

    python examples/train_demo.py [--total-steps N] [--out DIR]

It is the same run as ``packrl train gridworld`` (the gridworld preset: 32 envs, hidden 64, 32 steps per
rollout, learning rate 2e-3, gamma 0.95; seed 0): this script only calls that command, then ``packrl eval``.
"""
from __future__ import annotations

import argparse
import sys
import time

from packrl import cli
from packrl.envs.gridworld import LEARNED_THRESHOLD, RANDOM_RETURN


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-steps", type=int, help="agent steps (default: packrl train's default)")
    parser.add_argument("--out", help="run folder (default: runs/demo-<date>-<time>)")
    args = parser.parse_args()
    out = args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    command = ["train", "gridworld", "--out", out]
    if args.total_steps is not None:
        command += ["--total-steps", str(args.total_steps)]
    print(f"gridworld: a random policy scores about {RANDOM_RETURN}, a learned one above {LEARNED_THRESHOLD}")
    print("$ packrl " + " ".join(command), flush=True)
    rc = cli.main(command)
    if rc == 0:
        print(f"$ packrl eval {out}/checkpoint", flush=True)
        rc = cli.main(["eval", f"{out}/checkpoint"])
    return rc


if __name__ == "__main__":
    sys.exit(main())
