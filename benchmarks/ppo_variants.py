"""update() and collect() of several versions of packrl/train/ppo.py, side by side on the same env and policy.

Each path is a copy of ppo.py (for example ``git show 607947f:packrl/train/ppo.py > /tmp/ppo_607947f.py``); the
rest of packrl is the working tree's. Every version trains its own PPO on 8 Numba CartPoles (or gymnasium ones)
with CleanRL's hyperparameters (128 steps, 4 epochs x 4 minibatches) and the default policy (64 hidden); rounds
alternate between versions and each phase is timed in process CPU time (``time.process_time``), which other
jobs on a shared machine disturb less than the wall clock. Prints medians per phase and ratios to the first.

    flock /tmp/cpu.lock .venv/bin/python benchmarks/ppo_variants.py /tmp/ppo_607947f.py packrl/train/ppo.py [--compile 2]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import torch
from common import machine_line


def load(path: str, index: int):
    name = f"ppo_variant_{index}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="copies of packrl/train/ppo.py")
    parser.add_argument("--compile", type=int, action="append", default=[],
                        help="index (0-based) of a path to run with PPOConfig(compile=True); repeatable")
    parser.add_argument("--backend", choices=("numba", "serial"), default="numba")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from packrl import vector
    from packrl.models import Policy

    runs = {}
    for i, path in enumerate(args.paths):
        module = load(path, i)
        creator = "cartpole" if args.backend == "numba" else (lambda: gym.make("CartPole-v1"))
        env = vector.make(creator, 8, backend=args.backend, seed=0)
        torch.manual_seed(0)
        ppo = module.PPO(env, Policy.from_env(env, hidden=64), module.PPOConfig(
            num_steps=128, update_epochs=4, num_minibatches=4, device="cpu", compile=i in args.compile))
        ppo.collect()
        ppo.update()  # warm-up (and compilation)
        runs[f"{i}: {Path(path).name}" + (" compile" if i in args.compile else "")] = ppo
    times: dict[str, dict[str, list]] = {name: {"collect": [], "update": []} for name in runs}
    for _ in range(args.rounds):
        for name, ppo in runs.items():
            start = time.process_time()
            ppo.collect()
            middle = time.process_time()
            ppo.update()
            times[name]["collect"].append(middle - start)
            times[name]["update"].append(time.process_time() - middle)
    print(machine_line())
    print(f"{args.backend} CartPole, 8 envs x 128 steps, 4 x 4 minibatches, default policy (64 hidden), one torch "
          f"thread; CPU ms per phase, median of {args.rounds} alternating rounds")
    first = next(iter(times.values()))
    for name, phases in times.items():
        c, u = (statistics.median(phases[k]) * 1e3 for k in ("collect", "update"))
        c0, u0 = (statistics.median(first[k]) * 1e3 for k in ("collect", "update"))
        print(f"{name:40} collect {c:7.2f} ms ({c / c0:.2f}x)   update {u:7.2f} ms ({u / u0:.2f}x, "
              f"{u / 16:.3f} ms per minibatch)")


if __name__ == "__main__":
    main()
