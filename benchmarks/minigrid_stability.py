"""MiniGrid without collapses (issue 30): after a run first reaches 0.9, does its training mean stay up?

For each seed, `packrl train ENV --seed S --total-steps BUDGET` (the minigrid preset, plus any --set) runs to its
budget. The figure is the 5-iteration training mean: the mean return of the episodes that finished in the last
5 iterations (sampled actions, as trained). Reported per run: the frames at which that mean first reached 0.9,
and its lowest value after that (the target: never below 0.5), with the frames where the lowest value fell.

    .venv/bin/python benchmarks/minigrid_stability.py [--env MiniGrid-DoorKey-6x6-v0] [--seeds 3]
        [--budget 150000] [--within 100000] [--log-every 5] [--set train.anneal_lr=true]
        [--capability default,avx2 [--jobs 2]]

``--capability`` runs every seed once per torch CPU kernel set (``ATEN_CPU_CAPABILITY``: default, avx2, avx512,
each as far as the CPU has it), each run in a child process with the variable set (torch reads it when it loads):
a run's trajectory follows its floating-point rounding, so a claim measured on one CPU's kernels may not hold on
another's (issue 42: DoorKey-6x6 seed 1 learned with the default kernels and not with avx2).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import torch
from common import machine_line, print_table, record_returns, setting_changes

FIRST, FLOOR, SPAN = 0.9, 0.5, 5  # reach FIRST, then never below FLOOR; means over SPAN iterations


@dataclass
class Run:
    first: int | None  # frames when the SPAN-iteration mean first reached FIRST
    lowest: float | None  # the lowest SPAN-iteration mean after that
    lowest_at: int | None
    final: float
    seconds: float


def run(env_id: str, seed: int, budget: int, changes: dict, log_every: int = 0) -> Run:
    from packrl import config as settings
    from packrl.train.run import build_ppo

    flags = {"env": {"id": env_id}, "train": {"seed": seed, "total_steps": budget}}
    for section, values in changes.items():
        flags.setdefault(section, {}).update(values)
    config, _ = settings.resolve(flags=flags)
    start = time.perf_counter()
    ppo = build_ppo(config)
    finished: list = []

    record_returns(ppo, finished.append)
    recent: deque = deque(maxlen=SPAN)
    state = {"first": None, "lowest": None, "lowest_at": None, "mean": float("nan")}

    def callback(stats: dict) -> None:
        recent.append(finished[-1] if finished else [])
        returns = [r for iteration in recent for r in iteration]
        if log_every and stats["iteration"] % log_every == 0:
            print(f"      {stats['global_step']:,} frames: {SPAN}-iteration mean "
                  f"{np.mean(returns) if returns else float('nan'):.3f}, entropy {stats['entropy']:.3f}", flush=True)
        if len(recent) < SPAN or not returns:
            return
        state["mean"] = mean = float(np.mean(returns))
        if state["first"] is None and mean >= FIRST:
            state["first"] = stats["global_step"]
        elif state["first"] is not None and (state["lowest"] is None or mean < state["lowest"]):
            state["lowest"], state["lowest_at"] = mean, stats["global_step"]

    ppo.train(budget, callback)
    ppo.env.close()
    result = Run(state["first"], state["lowest"], state["lowest_at"], state["mean"], time.perf_counter() - start)
    print(f"    {env_id} seed {seed}: first {FIRST} at {result.first}, lowest after it {result.lowest} at "
          f"{result.lowest_at}, final {result.final:.3f}, {result.seconds:.0f} s", flush=True)
    return result


def child_run(capability: str, seed: int, args: argparse.Namespace) -> Run:
    """One seed in a child process whose torch uses the ``capability`` kernels; its log lines are printed after it."""
    command = [sys.executable, __file__, "--env", args.env, "--seeds", "1", "--first-seed", str(seed), "--budget",
               str(args.budget), "--log-every", str(args.log_every), "--json", *[f"--set={s}" for s in args.set]]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "ATEN_CPU_CAPABILITY": capability})
    if done.returncode:
        raise SystemExit(f"{capability} seed {seed} failed:\n{done.stderr[-3000:]}")
    *lines, result = done.stdout.strip().splitlines()
    print("\n".join(f"  [{capability}] {line.strip()}" for line in lines), flush=True)
    return Run(**json.loads(result))


def met(run: Run, within: int) -> bool:
    return run.first is not None and run.first <= within and (run.lowest is None or run.lowest >= FLOOR)


def print_runs(title: str, seeds: list[int], runs: list[Run], within: int) -> None:
    rows = [(str(seed), f"{r.first:,}" if r.first else "not reached",
             f"{r.lowest:.3f} at {r.lowest_at:,}" if r.lowest is not None else "-",
             "yes" if r.first and (r.lowest is None or r.lowest >= FLOOR) else "no", f"{r.final:.3f}", f"{r.seconds:.0f}")
            for seed, r in zip(seeds, runs)]
    print_table(title, ["seed", f"frames to {FIRST}", "lowest after", f"never below {FLOOR}", "final", "seconds"], rows)
    print(f"target ({FIRST} within {within:,} frames, then never below {FLOOR}): "
          f"{sum(met(r, within) for r in runs)}/{len(runs)} seeds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="MiniGrid-DoorKey-6x6-v0")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=150_000)
    parser.add_argument("--within", type=int, default=100_000,
                        help="frames within which 0.9 must be reached (issue 30: DoorKey-6x6 100k, Fetch-5x5-N2 300k)")
    parser.add_argument("--log-every", type=int, default=0, help="print the training mean every N iterations")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting on top of the preset, e.g. train.anneal_lr=true")
    parser.add_argument("--capability", default=None, metavar="NAME[,NAME]",
                        help="run every seed once per ATEN_CPU_CAPABILITY (default, avx2, avx512), in child processes")
    parser.add_argument("--jobs", type=int, default=1, help="with --capability: child runs at a time (2 at most on "
                        "a 2-core machine; each trains on one torch thread)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child run: its Run as JSON, last
    args = parser.parse_args()
    changes = setting_changes(args.set)
    torch.set_num_threads(1)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.json:
        print(f"torch CPU kernels: {torch.backends.cpu.get_cpu_capability()}", flush=True)
        print(json.dumps(asdict(run(args.env, seeds[0], args.budget, changes, args.log_every))))
        return
    print(machine_line())
    print(f"{args.env}, packrl defaults{''.join(' ' + s for s in args.set)}, {args.budget:,} frames per seed; "
          f"figure: the mean return of the episodes finished in the last {SPAN} iterations (sampled actions)\n")
    if args.capability is None:
        print(f"torch CPU kernels: {torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY "
              f"{os.environ.get('ATEN_CPU_CAPABILITY', 'unset')})")
        runs = [run(args.env, seed, args.budget, changes, args.log_every) for seed in seeds]
        print_runs(f"{args.env} stability", seeds, runs, args.within)
        return
    capabilities = args.capability.split(",")
    jobs = [(capability, seed) for capability in capabilities for seed in seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(zip(jobs, pool.map(lambda job: child_run(*job, args), jobs)))
    for capability in capabilities:
        print_runs(f"{args.env} stability, ATEN_CPU_CAPABILITY={capability}", seeds,
                   [results[capability, seed] for seed in seeds], args.within)
    print(f"\nall kernels: {sum(met(r, args.within) for r in results.values())}/{len(results)} runs met the target")


if __name__ == "__main__":
    main()
