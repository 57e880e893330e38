"""Multi-agent Numba envs: agent-steps/s of the Numba simple_spread next to mpe2's simple_spread_v3 through packrl's
serial backend (vector.make of the emulated ParallelEnv), side by side in one run, at 64 copies on one core;
the Numba env alone at 4096 copies on one core (threads=1); then the Numba connect_four next to PettingZoo's
connect_four_v3 through the serial backend at 64 copies (moves/s: copies x steps; each step's legal random moves are
drawn outside the timed step call, from the rows' action masks, for both alike); then the Numba simple_tag (two
agent groups: observations of 16 and 14 floats, packed rows) next to mpe2's simple_tag_v3 through the serial
backend at 64 copies (agent-steps/s, 4 agents per copy).

Targets (issue 40): >= 100x mpe2 through the serial backend at 64 copies; >= 10M agent-steps/s at 4096 copies;
connect_four >= 100x PettingZoo's through packrl.
Each cell: median of --repeats interleaved timed runs of fixed random actions (3 agents per copy: an agent-step is
one agent's step). Usage: python benchmarks/numba_multiagent.py [--repeats N] [--seconds S]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np
from common import machine_line
from mpe2 import simple_spread_v3, simple_tag_v3
from pettingzoo.classic import connect_four_v3

from packrl import vector

AGENTS = 3


def timed(step: Callable[[np.ndarray], Any], actions: np.ndarray, rows: int, seconds: float) -> tuple[float, float]:
    """Agent-steps per wall second and per CPU second of this process, of ``step`` run for about ``seconds``."""
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        for k in range(8):
            step(actions[k])
        calls += 8
    return calls * rows / (time.perf_counter() - start), calls * rows / max(time.process_time() - cpu, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    print(machine_line(("mpe2",)))
    built: dict[str, tuple[Any, int]] = {}
    ref = vector.make(lambda: simple_spread_v3.parallel_env(), 64, backend="serial", seed=0)
    built["mpe2 simple_spread_v3, serial backend, 64 copies"] = (ref, 64)
    for n in (64, 4096):
        built[f"packrl numba simple_spread, threads=1, {n} copies"] = (
            vector.make("simple_spread", n, backend="numba", seed=0, threads=1), n)
    rates: dict[str, list[float]] = {name: [] for name in built}
    cpu_rates: dict[str, list[float]] = {name: [] for name in built}
    steps = {}
    for name, (env, n) in built.items():
        env.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 5, (8, n * AGENTS))
        steps[name] = (env.step, actions, n * AGENTS)
        for k in range(8):
            env.step(actions[k])
    for _ in range(args.repeats):  # interleaved: the machine's load falls on every row alike
        for name, (step, actions, rows) in steps.items():
            seconds = args.seconds if "mpe2" not in name else min(args.seconds, 1.0)
            wall, cpu = timed(step, actions, rows, seconds)
            rates[name].append(wall)
            cpu_rates[name].append(cpu)
    print(f"\nagent-steps per wall second, median [min-max] of {args.repeats} interleaved runs of {args.seconds} s; "
          "then per CPU second of this process (the rate on a core of its own; the machine is shared):")
    for name, r in rates.items():
        c = cpu_rates[name]
        print(f"  {name:<52} {statistics.median(r) / 1e6:8.3f}M [{min(r) / 1e6:.3f}-{max(r) / 1e6:.3f}]   "
              f"CPU: {statistics.median(c) / 1e6:8.3f}M")
    ref_rates = rates["mpe2 simple_spread_v3, serial backend, 64 copies"]
    ours = rates["packrl numba simple_spread, threads=1, 64 copies"]
    pairs = sorted(a / b for a, b in zip(ours, ref_rates))
    print(f"\nnumba / mpe2 at 64 copies, paired by round: median {statistics.median(pairs):.0f}x "
          f"[{pairs[0]:.0f}-{pairs[-1]:.0f}] (target >= 100x)")
    big = rates["packrl numba simple_spread, threads=1, 4096 copies"]
    big_cpu = cpu_rates["packrl numba simple_spread, threads=1, 4096 copies"]
    print(f"numba at 4096 copies, one thread: median {statistics.median(big) / 1e6:.2f}M agent-steps per wall second, "
          f"{statistics.median(big_cpu) / 1e6:.2f}M per CPU second (target >= 10M)")
    connect_four(args.repeats, args.seconds)
    simple_tag(args.repeats, args.seconds)


def simple_tag(repeats: int, seconds: float) -> None:
    n, agents = 64, 4
    built = {"mpe2 simple_tag_v3, serial backend": vector.make(lambda: simple_tag_v3.parallel_env(), n,
                                                                backend="serial", seed=0),
             "packrl numba simple_tag, threads=1": vector.make("simple_tag", n, backend="numba", seed=0, threads=1)}
    actions = np.random.default_rng(0).integers(0, 5, (8, n * agents))
    rates: dict[str, list[float]] = {name: [] for name in built}
    for env in built.values():
        env.reset(seed=0)
    for _ in range(repeats):
        for name, env in built.items():
            rates[name].append(timed(env.step, actions, n * agents, min(seconds, 1.0) if "mpe2" in name else seconds)[0])
    print(f"\nsimple_tag at {n} copies (two agent groups), agent-steps/s, median [min-max]:")
    for name, r in rates.items():
        print(f"  {name:<52} {statistics.median(r) / 1e6:8.3f}M [{min(r) / 1e6:.3f}-{max(r) / 1e6:.3f}]")
    ref, ours = rates.values()
    pairs = sorted(o / r for r, o in zip(ref, ours))
    print(f"numba / mpe2, paired by round: median {statistics.median(pairs):.0f}x [{pairs[0]:.0f}-{pairs[-1]:.0f}]")


def moves_per_second(env: Any, n: int, seconds: float, rng: np.random.Generator) -> float:
    """Copies x steps per second of ``env.step`` alone, with legal random moves from the rows' action masks."""
    masks_of = env.emulated.observation
    took, steps = 0.0, 0
    while took < seconds:
        mask = masks_of.unpack(env.observations)["action_mask"].astype(bool)
        acts = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
        start = time.perf_counter()
        env.step(acts)
        took += time.perf_counter() - start
        steps += 1
    return steps * n / took


def connect_four(repeats: int, seconds: float) -> None:
    n = 64
    built = {"pettingzoo connect_four_v3, serial backend": vector.make(connect_four_v3.env, n, backend="serial", seed=0),
             "packrl numba connect_four, threads=1": vector.make("connect_four", n, backend="numba", seed=0, threads=1)}
    rates: dict[str, list[float]] = {name: [] for name in built}
    for env in built.values():
        env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(repeats):
        for name, env in built.items():
            rates[name].append(moves_per_second(env, n, seconds, rng))
    print(f"\nconnect_four at {n} copies, moves/s (copies x steps, the step call alone), median [min-max]:")
    for name, r in rates.items():
        print(f"  {name:<52} {statistics.median(r) / 1e6:8.3f}M [{min(r) / 1e6:.3f}-{max(r) / 1e6:.3f}]")
    ref, ours = rates.values()
    pairs = sorted(o / r for r, o in zip(ref, ours))
    print(f"numba / pettingzoo, paired by round: median {statistics.median(pairs):.0f}x [{pairs[0]:.0f}-{pairs[-1]:.0f}] "
          "(target >= 100x)")


if __name__ == "__main__":
    main()
