"""Multiprocessing's bimodal rounds (issue 19): does a round's speed follow how its waits ended?

Every row is built once, then --rounds interleaved rounds time each row in turn (serial, the
default multiprocessing split, and the same split with other spin windows). For each round of a
multiprocessing row it prints the agent-steps/s, the cores other jobs used meanwhile, and how the
main process's and the worker's waits for the other side ended in that round: the post was there
at once, came while spinning, or the process blocked in the kernel (``Multiprocessing.wait_counts``).
If the slow rounds are the rounds whose waits blocked, the modes are spin versus blocking wake-ups.

Usage: python benchmarks/mp_waits.py [--envs CartPole-v1] [--sizes 8,64] [--spins 100/200,0/0,1000/1000]
       [--rounds 12] [--seconds 0.3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line
from vector import ENVS, make_vectorizer, timed_round, vectorizer_pids


def _blocked_share(before: dict, after: dict, who: str) -> tuple[float, int]:
    """Fraction of ``who``'s waits in the round that blocked, and how many waits there were."""
    delta = {k: after[who][k] - before[who][k] for k in after[who]}
    total = sum(delta.values())
    return (delta["blocked"] / total if total else 0.0), total


def run(env_name: str, n: int, spins: list[str], rounds: int, seconds: float) -> None:
    names = ["packrl serial"] + [f"packrl mp spin {s}" for s in spins]
    built = {name: make_vectorizer(name, ENVS[env_name], n) for name in names}
    actions = np.zeros(n, np.int64)
    pids = {name: vectorizer_pids(v) for name, (v, _, _) in built.items()}
    rates: dict[str, list[float]] = {name: [] for name in names}
    cells: dict[str, list[str]] = {name: [] for name in names}
    try:
        for _, step, _ in built.values():
            for _ in range(50):
                step(actions)
        for _ in range(rounds):
            for name, (v, step, _) in built.items():
                counts = v.wait_counts() if hasattr(v, "wait_counts") else None
                rate, other = timed_round(step, actions, n, seconds, pids[name])
                rates[name].append(rate)
                cell = f"{rate / 1e3:.0f}k@{other:.1f}"
                if counts is not None:
                    after = v.wait_counts()
                    main, _ = _blocked_share(counts, after, "main")
                    worker, _ = _blocked_share(counts, after, "worker 0")
                    cell += f" b{main:.0%}/{worker:.0%}"
                cells[name].append(cell)
    finally:
        for _, _, close in built.values():
            close()
    serial = statistics.median(rates["packrl serial"])
    print(f"\n{env_name}, {n} envs, {rounds} interleaved rounds of {seconds} s; per round: k agent-steps/s @ cores "
          "other jobs used, b<main blocked>/<worker blocked> (share of the round's waits that blocked)")
    for name in names:
        r = rates[name]
        print(f"  {name:<26} median {statistics.median(r) / 1e3:7.1f}k = {statistics.median(r) / serial:.2f}x serial "
              f"[{min(r) / 1e3:.0f}-{max(r) / 1e3:.0f}k]")
        print("    " + "  ".join(cells[name]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="CartPole-v1", help=f"comma-separated, from {sorted(ENVS)}")
    parser.add_argument("--sizes", default="8,64")
    parser.add_argument("--spins", default="100/200,0/0,1000/1000", help="main/worker spin windows in us")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=0.3)
    args = parser.parse_args()
    print(machine_line())
    for env_name in args.envs.split(","):
        for n in (int(x) for x in args.sizes.split(",")):
            run(env_name, n, args.spins.split(","), args.rounds, args.seconds)


if __name__ == "__main__":
    main()
