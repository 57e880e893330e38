"""1 rank against 2 ranks on this machine: `packrl train cartpole` as one process with 2N envs, and under
`torchrun --standalone --nproc-per-node 2` with N envs per rank (gloo, CPU): the same batch per iteration (2N envs x
num_steps), the same settings (the classic-control preset: N = 4 here), the same seeds.

Per run it reads the run's history.jsonl as the run writes it: agent steps to CartPole 475 (the first iteration at
which the mean return of the last >= 20 finished episodes, over all ranks, reaches 475; the run is then stopped with
SIGTERM) and the median steps/s of the iterations (`sps`: both ranks' agent steps over rank 0's iteration time;
the first 3 iterations, which compile, are left out). Then the ratios 2 ranks / 1 rank, per seed and of the means.

    flock /tmp/cpu.lock .venv/bin/python benchmarks/scale.py [--seeds 3] [--budget 100000] [--envs-per-rank 4]

On the 2-core project machine both ranks share the cores with each other (and whatever else runs), and every
minibatch's gradients cross a gloo all-reduce: steps/s is not expected to double here; the steps to 475 are the
learning side of the claim (issue 31's target: 2 ranks within 20% of 1 rank with twice the envs).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine_line

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD, WINDOW = 475.0, 20


def crossing(rows: list[dict]) -> int | None:
    """The global_step of the first iteration at which the mean return of the last >= WINDOW episodes (taking
    whole iterations back from it, weighted by their episode counts) reaches THRESHOLD; None if none does."""
    for i in range(len(rows)):
        episodes = returns = 0.0
        for row in reversed(rows[:i + 1]):
            n = row.get("episodes", 0)
            if n and isinstance(row.get("episode_return"), float):
                episodes += n
                returns += n * row["episode_return"]
            if episodes >= WINDOW:
                break
        if episodes >= WINDOW and returns / episodes >= THRESHOLD:
            return rows[i]["global_step"]
    return None


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return rows


def one_run(ranks: int, envs_per_rank: int, seed: int, budget: int, folder: Path) -> dict:
    """Train until the threshold is crossed (then SIGTERM) or the budget is spent."""
    train = ["-m", "packrl", "train", "cartpole", "--no-live", "--checkpoint-minutes", "0", "--out", str(folder),
             "--train.seed", str(seed), "--total-steps", str(budget), "--vec.num_envs", str(envs_per_rank * (
                 2 if ranks == 1 else 1))]
    if ranks == 1:
        command = [sys.executable, *train]
    else:
        command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", str(ranks),
                   *train]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found, seconds = None, None
    while proc.poll() is None:
        time.sleep(0.5)
        found = crossing(read_rows(folder / "history.jsonl"))
        if found is not None:
            seconds = time.perf_counter() - start
            proc.send_signal(signal.SIGTERM)  # torchrun passes it to its ranks: they save and stop together
            break
    _, err = proc.communicate(timeout=600)
    rows = read_rows(folder / "history.jsonl")
    if not rows:
        raise RuntimeError(f"{ranks} rank(s), seed {seed}: no history; stderr: {err[-2000:]}")
    found = found if found is not None else crossing(rows)
    sps = [r["sps"] for r in rows[3:]] or [r["sps"] for r in rows]
    return {"steps_to_475": found, "seconds_to_475": seconds, "sps": statistics.median(sps),
            "last_step": rows[-1]["global_step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=100_000, help="agent steps at most per run (all ranks)")
    parser.add_argument("--envs-per-rank", type=int, default=4, help="N: 2 ranks of N envs against 1 of 2N")
    args = parser.parse_args()
    print(machine_line())
    print(f"packrl train cartpole (classic-control preset), {2 * args.envs_per_rank} envs in all, budget "
          f"{args.budget:,} agent steps, threshold {THRESHOLD:g} over the last >= {WINDOW} episodes")
    results: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for ranks in (1, 2):  # interleaved: a change in the machine's load hits both alike
                r = one_run(ranks, args.envs_per_rank, seed, args.budget, Path(tmp) / f"r{ranks}-s{seed}")
                results[ranks].append(r)
                steps = f"{r['steps_to_475']:,}" if r["steps_to_475"] is not None else f"not within {args.budget:,}"
                secs = f"{r['seconds_to_475']:.1f} s" if r["seconds_to_475"] is not None else "-"
                print(f"seed {seed} {ranks} rank{'s' if ranks > 1 else ' '} x {args.envs_per_rank * (2 // ranks)} envs: "
                      f"steps to 475 {steps}, wall to 475 {secs} (start-up included), median {r['sps']:,.0f} steps/s",
                      flush=True)
    print()
    for ranks in (1, 2):
        crossed = [r["steps_to_475"] for r in results[ranks] if r["steps_to_475"] is not None]
        mean = f"{statistics.mean(crossed):,.0f}" if crossed else "-"
        print(f"{ranks} rank{'s' if ranks > 1 else ' '}: crossed {len(crossed)}/{len(results[ranks])}, mean steps to 475 "
              f"{mean}, median steps/s {statistics.median(r['sps'] for r in results[ranks]):,.0f}")
    both = [(a["steps_to_475"], b["steps_to_475"]) for a, b in zip(results[1], results[2])
            if a["steps_to_475"] is not None and b["steps_to_475"] is not None]
    if both:
        ratio = statistics.mean(b for _, b in both) / statistics.mean(a for a, _ in both)
        print(f"steps to 475, 2 ranks / 1 rank (means over the {len(both)} seeds both crossed): {ratio:.2f} "
              f"(per seed: {', '.join(f'{b / a:.2f}' for a, b in both)}); target: within 20% (0.8-1.2)")
    sps_ratio = statistics.median(r["sps"] for r in results[2]) / statistics.median(r["sps"] for r in results[1])
    print(f"steps/s, 2 ranks / 1 rank (medians): {sps_ratio:.2f}")


if __name__ == "__main__":
    main()
