"""CartPole agent-steps/s: packrl's Numba batched env next to gymnasium's CartPoleVectorEnv (numpy
batched) and SyncVectorEnv(CartPole-v1), side by side, at 1, 64 and 4096 envs; then the serial vs
threaded crossover and the kernels' compile and cache-load times (each in a fresh process).

Targets on 2 cores (issue 5): >= 10x CartPoleVectorEnv at 64 envs, >= 2x at 4096, >= 100x
SyncVectorEnv at 4096. Each cell: median of --repeats timed runs of fixed random actions.
--interleave R: instead, R rounds that time the serial loop, 2 threads and CartPoleVectorEnv in turn
at --sizes (default 4096), each round with the cores other jobs kept busy meanwhile, and the ratio of
each round's pair (the load falls on both sides alike).
--busy R: the threaded default against threads=1 with a core idle and with one core held: R interleaved rounds
(serial loop, 2 threads as the default was before issue 40, the default, CartPoleVectorEnv) at --sizes (default
4096), first as the machine is, then with a CPU-bound process of this script's pinned to the last core; each
round's ratios default / threads=1 (target >= 0.9 with the core held) and default / CartPoleVectorEnv.
Usage: python benchmarks/numba_envs.py [--repeats N] [--quick] [--interleave R | --busy R [--sizes 4096] [--seconds S]]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Callable

import gymnasium
import numpy as np
from common import machine_line
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from vector import busy_cpu_s

import packrl.envs as envs


def steps_per_second(step: Callable[[np.ndarray], Any], actions: np.ndarray, num_envs: int, repeats: int,
                     budget: float) -> list[float]:
    """Agent-steps/s of ``repeats`` runs, each about ``budget`` seconds long."""
    step(actions[0])
    calls = 1
    while True:  # size a run to the budget
        start = time.perf_counter()
        for k in range(calls):
            step(actions[k % len(actions)])
        took = time.perf_counter() - start
        if took > budget / 4 or calls > 1_000_000:
            break
        calls *= 4
    calls = max(1, int(calls * budget / max(took, 1e-9)))
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for k in range(calls):
            step(actions[k % len(actions)])
        rates.append(calls * num_envs / (time.perf_counter() - start))
    return rates


def makers(n: int) -> dict[str, Callable[[], Callable[[np.ndarray], Any]]]:
    def packrl_env(threads: int | None) -> Callable:
        env = envs.make("cartpole", num_envs=n, seed=0, threads=threads)
        env.reset()
        return env.step

    def gym_vector() -> Callable:
        env = CartPoleVectorEnv(num_envs=n)
        env.reset(seed=0)
        return env.step

    def gym_sync() -> Callable:
        env = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * n)
        env.reset(seed=0)
        return env.step

    return {"packrl numba (serial)": lambda: packrl_env(1), "packrl numba (2 threads)": lambda: packrl_env(2),
            "gymnasium CartPoleVectorEnv": gym_vector, "gymnasium SyncVectorEnv": gym_sync}


def throughput_table(sizes: tuple[int, ...], repeats: int, budget: float) -> dict:
    rng = np.random.default_rng(0)
    results: dict = {}
    for n in sizes:
        actions = rng.integers(0, 2, (16, n))
        for name, make in makers(n).items():
            if name.endswith("(2 threads)") and n == 1:
                continue
            sync_budget = budget if "Sync" not in name else min(budget, 0.5)
            rates = steps_per_second(make(), actions, n, repeats, sync_budget)
            results[(name, n)] = rates
    return results


def _si(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k"


def print_throughput(results: dict, sizes: tuple[int, ...]) -> None:
    names = sorted({name for name, _ in results}, key=lambda s: (not s.startswith("packrl"), s))
    print(f"\n{'agent-steps/s (median [min-max])':<30}" + "".join(f"{n:>34}" for n in sizes))
    for name in names:
        cells = []
        for n in sizes:
            r = results.get((name, n))
            cells.append(f"{_si(statistics.median(r))} [{_si(min(r))}-{_si(max(r))}]" if r else "-")
        print(f"{name:<30}" + "".join(f"{c:>34}" for c in cells))
    print("\nratios of medians (best packrl kernel / anchor), targets: >=10x VectorEnv@64, >=2x VectorEnv@4096, >=100x Sync@4096")
    for anchor in ("gymnasium CartPoleVectorEnv", "gymnasium SyncVectorEnv"):
        row = []
        for n in sizes:
            ours = max(statistics.median(results[(k, n)]) for k in ("packrl numba (serial)", "packrl numba (2 threads)")
                       if (k, n) in results)
            row.append(f"{ours / statistics.median(results[(anchor, n)]):.1f}x")
        print(f"  vs {anchor:<28}" + "".join(f"{c:>10}" for c in row) + "   (at " + ", ".join(map(str, sizes)) + " envs)")


def crossover(sizes: tuple[int, ...], repeats: int, budget: float) -> None:
    """Serial loop vs prange on 2 threads, by batch size (sets PARALLEL_MIN_ENVS)."""
    rng = np.random.default_rng(0)
    print("\nserial vs threaded (CartPole, median M agent-steps/s):")
    for n in sizes:
        actions = rng.integers(0, 2, (16, n))
        row = {}
        for threads in (1, 2):
            env = envs.make("cartpole", num_envs=n, threads=threads)
            env.reset()
            row[threads] = statistics.median(steps_per_second(env.step, actions, n, repeats, budget))
        print(f"  {n:>7} envs: serial {_si(row[1]):>8}   2 threads {_si(row[2]):>8}   threaded/serial {row[2] / row[1]:.2f}")


_CHILD = """
import json, time
t = time.perf_counter()
import packrl.envs as envs
imported = time.perf_counter() - t
out = {"import_s": imported}
for name, threads in (("cartpole", 1), ("cartpole", 2), ("gridworld", 1)):
    env = envs.make(name, num_envs=64, threads=threads)
    out[f"{name} threads={threads}"] = [[r.kernel, r.source, r.seconds] for r in env.compile_records]
print(json.dumps(out))
"""


def compile_times() -> None:
    """Compile in a fresh process with empty caches, then load in a second fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PACKRL_NUMBA_CACHE=os.path.join(tmp, "kernels"), NUMBA_CACHE_DIR=os.path.join(tmp, "numba"))
        print("\nkernel build times, fresh process each (cold: empty caches; warm: loaded from the caches cold wrote):")
        for label in ("cold", "warm"):
            start = time.perf_counter()
            child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, check=True)
            total = time.perf_counter() - start
            data = json.loads(child.stdout.strip().splitlines()[-1])
            parts = "; ".join(f"{k}: " + ", ".join(f"{kern} {src} {s:.2f}s" for kern, src, s in v)
                              for k, v in data.items() if k != "import_s")
            print(f"  {label}: process {total:.1f}s (import {data['import_s']:.1f}s) | {parts}")


def interleaved_rounds(n: int, rounds: int, seconds: float) -> None:
    """Rounds of (serial, 2 threads, CartPoleVectorEnv) at ``n`` envs, each timed for ``seconds``."""
    built = {name: make() for name, make in makers(n).items() if "Sync" not in name}
    actions = np.random.default_rng(0).integers(0, 2, (16, n))
    for step in built.values():
        for k in range(20):
            step(actions[k % 16])
    rates, other = _timed_rounds(built, actions, n, rounds, seconds)
    anchor = rates["gymnasium CartPoleVectorEnv"]
    print(f"\n{n} envs, {rounds} interleaved rounds of {seconds} s each: M agent-steps/s @ cores other jobs used")
    for name, r in rates.items():
        cells = " ".join(f"{x / 1e6:.1f}@{o:.1f}" for x, o in zip(r, other[name]))
        print(f"  {name:<28} median {statistics.median(r) / 1e6:6.2f}M  rounds: {cells}")
    for name in ("packrl numba (serial)", "packrl numba (2 threads)"):
        pairs = sorted(a / b for a, b in zip(rates[name], anchor))
        print(f"  {name} / CartPoleVectorEnv, paired by round: median {statistics.median(pairs):.2f}x "
              f"[{pairs[0]:.2f}-{pairs[-1]:.2f}], >= 2x in {sum(p >= 2 for p in pairs)} of {len(pairs)} rounds")


_SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


@contextmanager
def one_core_held() -> Any:
    """A CPU-bound process pinned to the machine's last core while the block runs."""
    core = max(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", _SPIN, str(core)])
    try:
        time.sleep(0.5)
        yield core
    finally:
        spinner.kill()
        spinner.wait()


def _timed_rounds(built: dict, actions: np.ndarray, n: int, rounds: int, seconds: float) -> tuple[dict, dict]:
    rates: dict[str, list[float]] = {name: [] for name in built}
    other: dict[str, list[float]] = {name: [] for name in built}
    for _ in range(rounds):
        for name, step in built.items():
            machine, own = busy_cpu_s(), time.process_time()
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                for k in range(10):
                    step(actions[k])
                calls += 10
            wall = time.perf_counter() - start
            rates[name].append(calls * n / wall)
            other[name].append((busy_cpu_s() - machine - (time.process_time() - own)) / wall)
    return rates, other


def busy_rounds(n: int, rounds: int, seconds: float) -> None:
    """The default (timed choice) against threads=1 and 2 fixed threads, with no core and with one core held."""
    def packrl_env(threads: int | None) -> Callable:
        env = envs.make("cartpole", num_envs=n, seed=0, threads=threads)
        env.reset()
        built_envs[threads] = env
        return env.step

    built_envs: dict = {}
    built = {"threads=1": packrl_env(1), "threads=2 (old default)": packrl_env(2), "default (timed)": packrl_env(None),
             "CartPoleVectorEnv": makers(n)["gymnasium CartPoleVectorEnv"]()}
    actions = np.random.default_rng(0).integers(0, 2, (16, n))
    for step in built.values():
        for k in range(20):
            step(actions[k % 16])
    for condition in ("as the machine is", "one core held by a spinning process"):
        with (one_core_held() if condition.startswith("one") else _nothing()):
            rates, other = _timed_rounds(built, actions, n, rounds, seconds)
        print(f"\n{n} envs, {condition}: {rounds} interleaved rounds of {seconds} s: M agent-steps/s @ cores other "
              f"processes used (the spinner included)")
        for name, r in rates.items():
            cells = " ".join(f"{x / 1e6:.1f}@{o:.1f}" for x, o in zip(r, other[name]))
            print(f"  {name:<24} median {statistics.median(r) / 1e6:6.2f}M  rounds: {cells}")
        for name, anchor in (("default (timed)", "threads=1"), ("threads=2 (old default)", "threads=1"),
                             ("default (timed)", "CartPoleVectorEnv"), ("threads=2 (old default)", "CartPoleVectorEnv"),
                             ("threads=1", "CartPoleVectorEnv")):
            pairs = sorted(a / b for a, b in zip(rates[name], rates[anchor]))
            print(f"  {name} / {anchor}: over all rounds {sum(rates[name]) / sum(rates[anchor]):.2f}x, paired by round "
                  f"median {statistics.median(pairs):.2f}x [{pairs[0]:.2f}-{pairs[-1]:.2f}]")
        print(f"  the default's choice now: {built_envs[None].thread_choice!r}")


@contextmanager
def _nothing() -> Any:
    yield None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the script)")
    parser.add_argument("--interleave", type=int, default=0, help="rounds of serial / 2 threads / VectorEnv in turn")
    parser.add_argument("--busy", type=int, default=0, help="rounds of the default vs threads=1, idle then one core held")
    parser.add_argument("--sizes", default="4096", help="env counts for --interleave and --busy, e.g. 64,4096")
    parser.add_argument("--seconds", type=float, default=0.3, help="seconds per timed run in --interleave")
    args = parser.parse_args()
    budget = 0.1 if args.quick else 0.5
    print(machine_line())
    if args.busy:
        for n in (int(x) for x in args.sizes.split(",")):
            busy_rounds(n, args.busy, args.seconds)
        return
    if args.interleave:
        for n in (int(x) for x in args.sizes.split(",")):
            interleaved_rounds(n, args.interleave, args.seconds)
        return
    print("note: the project machine is shared with other jobs; the load above slows every column alike")
    sizes = (1, 64, 4096)
    for n in (1, 64, 4096):
        for threads in (1, 2):
            envs.make("cartpole", num_envs=n, threads=threads)  # compile or load before timing
    print_throughput(throughput_table(sizes, args.repeats, budget), sizes)
    crossover((256, 512, 1024, 2048, 4096, 16384, 65536) if not args.quick else (1024, 4096), args.repeats, budget)
    compile_times()


if __name__ == "__main__":
    main()
