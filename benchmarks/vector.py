"""Agent-steps/s of packrl's vector backends next to gymnasium and Stable-Baselines3, side by side.

Envs: CartPole-v1, StructuredEnv (12 KB Dict observation, negligible step, Discrete action) and the
same with a 100 us busy step; the 12 KB env with a MultiDiscrete, a Box and a hybrid Dict(Discrete(5),
Box(2)) action ("Dict 12KB <kind>-act"; the 100 us one with the Dict action too) and Pendulum-v1 (Box
action) by --envs; 8 and 64 envs. Each cell: median of --repeats timed runs (spread = min..max),
ratios against gymnasium SyncVectorEnv. Usage: python benchmarks/vector.py [--quick] [--repeats N]
Add "packrl ray" to --vectorizers for the ray backend (one actor per core of a local cluster).
"packrl mp workers" is the multiprocessing backend with every env in a worker (main_envs=0).
--splits "1/4,2/0" adds "packrl mp split W/M" rows (W workers, M envs in the main process, "auto" the
default share); --interleave times every row in alternating rounds (medians less skewed by other load).
--spins "20/50,100/200" adds "packrl mp spin M/W" rows: main/worker spin windows in us, to choose
the defaults of packrl/vector/multiprocessing.py.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from packrl import vector
from packrl.emulation.actions import ActionLayout
from packrl.vector.testing import StructuredEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line


class ActionKindEnv(StructuredEnv):
    """StructuredEnv (12 KB Dict observation) with another action space; the step ignores the action."""

    def __init__(self, action_space: spaces.Space, busy_us: float = 0.0):
        super().__init__(busy_us)
        self.action_space = action_space

    def step(self, action: Any) -> tuple:
        return super().step(0)


HYBRID = spaces.Dict({"move": spaces.Discrete(5), "aim": spaces.Box(-1, 1, (2,), np.float32)})
ACTION_KINDS = {
    "MultiDiscrete": spaces.MultiDiscrete([3, 4, 5]),
    "Box": spaces.Box(-1, 1, (2,), np.float32),
    "Dict": HYBRID,
}

ENVS = {
    "CartPole-v1": functools.partial(gymnasium.make, "CartPole-v1"),
    "Dict 12KB": StructuredEnv,
    "Dict 12KB +100us": functools.partial(StructuredEnv, busy_us=100.0),
    **{f"Dict 12KB {kind}-act": functools.partial(ActionKindEnv, space) for kind, space in ACTION_KINDS.items()},
    "Dict 12KB +100us Dict-act": functools.partial(ActionKindEnv, HYBRID, busy_us=100.0),
    "Pendulum-v1": functools.partial(gymnasium.make, "Pendulum-v1"),
}


def make_vectorizer(name: str, creator, n: int):
    """(vector env, step function taking an action batch)."""
    if name == "packrl serial":
        v = vector.make(creator, n)
    elif name == "packrl mp":
        v = vector.make(creator, n, backend="multiprocessing", context="fork")
    elif name == "packrl mp workers":
        v = vector.make(creator, n, backend="multiprocessing", context="fork", main_envs=0)
    elif name.startswith("packrl mp spin "):
        main_us, worker_us = (float(x) for x in name.split()[-1].split("/"))
        v = vector.make(creator, n, backend="multiprocessing", context="fork",
                        main_spin_s=main_us * 1e-6, worker_spin_s=worker_us * 1e-6)
    elif name.startswith("packrl mp split "):  # "packrl mp split W/M": W workers, M main envs (M "auto": default)
        workers, main = name.split()[-1].split("/")
        v = vector.make(creator, n, backend="multiprocessing", context="fork", num_workers=int(workers),
                        batch_size=n, main_envs=None if main == "auto" else int(main))
    elif name == "packrl ray":  # opt-in (--vectorizers): needs Ray; a local cluster takes seconds to start
        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        v = vector.make(creator, n, backend="ray")
    elif name == "gym Sync":
        v = gymnasium.vector.SyncVectorEnv([creator] * n)
    elif name == "gym Async(shm)":
        v = gymnasium.vector.AsyncVectorEnv([creator] * n, shared_memory=True, context="fork")
    elif name in ("sb3 Dummy", "sb3 Subproc"):
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

        v = DummyVecEnv([creator] * n) if name == "sb3 Dummy" else SubprocVecEnv([creator] * n, start_method="fork")
        v.reset()
        return v, v.step, v.close
    else:
        raise ValueError(name)
    v.reset(seed=0)
    return v, v.step, v.close


def action_batch(name: str, creator, n: int) -> Any:
    """n actions in the form the vectorizer's step takes, the same actions for all: gymnasium's batched
    native form, a list of native actions for SB3 (an array where it stacks), packrl's policy form
    (``ActionLayout.encode``). Discrete envs get action 0 (as this script always gave them)."""
    probe = creator()
    space = probe.action_space
    probe.close()
    space.seed(0)
    natives = [0 if isinstance(space, spaces.Discrete) else space.sample() for _ in range(n)]
    if name.startswith("gym "):
        return gymnasium.vector.utils.concatenate(space, natives, gymnasium.vector.utils.create_empty_array(space, n))
    if name.startswith("sb3 "):
        return natives if isinstance(space, spaces.Dict) else np.array(natives)
    policy = [ActionLayout(space).encode(a) for a in natives]
    if isinstance(policy[0], dict):
        return {k: np.stack([p[k] for p in policy]) for k in policy[0]}
    return np.stack(policy)


def agent_steps_per_s(name: str, creator, n: int, seconds: float, repeats: int) -> list[float]:
    v, step, close = make_vectorizer(name, creator, n)
    actions = action_batch(name, creator, n)
    for _ in range(20):  # warm up (first-call compiles, page faults)
        step(actions)
    rates = [timed_round(step, actions, n, seconds, vectorizer_pids(v))[0] for _ in range(repeats)]
    close()
    return rates


def vectorizer_pids(v: Any) -> list[int]:
    """This process and the vectorizer's workers (what its own CPU time is read from)."""
    return [os.getpid(), *getattr(v, "worker_pids", [])]


def timed_round(step, actions: Any, n: int, seconds: float, pids: list[int]) -> tuple[float, float]:
    """``step(actions)`` for about ``seconds``, in tens: (agent-steps/s, cores that other jobs than
    ``pids`` kept busy meanwhile; Linux, coarse: 10 ms ticks)."""
    machine, own = busy_cpu_s(), own_cpu_s(pids)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            step(actions)
        steps += 10
    wall = time.perf_counter() - start
    return steps * n / wall, (busy_cpu_s() - machine - own_cpu_s(pids) + own) / wall


def busy_cpu_s() -> float:
    """CPU seconds every process of the machine has run (Linux /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def own_cpu_s(pids: list[int]) -> float:
    """CPU seconds run by these processes (this one and a vectorizer's workers)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def interleaved(names: list[str], creator, n: int, seconds: float, rounds: int,
                other: dict[str, list[float]]) -> dict[str, list[float]]:
    """Every vectorizer built once, then ``rounds`` rounds that time each in turn, so load from
    other jobs falls on all of them alike (A/B/C, A/B/C, ... rather than A A A, B B B). ``other``
    gets, per round, the cores that other jobs kept busy meanwhile (Linux; coarse: 10 ms ticks)."""
    built = {name: make_vectorizer(name, creator, n) for name in names}
    batches = {name: action_batch(name, creator, n) for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    pids = {name: vectorizer_pids(v) for name, (v, _, _) in built.items()}
    try:
        for name, (_, step, _) in built.items():
            for _ in range(20):
                step(batches[name])
        for _ in range(rounds):
            for name, (_, step, _) in built.items():
                rate, busy = timed_round(step, batches[name], n, seconds, pids[name])
                rates[name].append(rate)
                other.setdefault(name, []).append(busy)
    finally:
        for _, _, close in built.values():
            close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument("--sizes", default="8,64")
    parser.add_argument("--vectorizers", default="gym Sync,gym Async(shm),sb3 Dummy,sb3 Subproc,packrl serial,packrl mp")
    parser.add_argument("--spins", default="", help="main/worker spin windows in us to compare, e.g. 20/50,100/200")
    parser.add_argument("--splits", default="", help="multiprocessing W/M splits to compare, e.g. 1/4,2/2,2/0,1/auto")
    parser.add_argument("--interleave", action="store_true", help="time the vectorizers in alternating rounds")
    parser.add_argument("--seconds", type=float, default=None, help="length of one timed round")
    args = parser.parse_args()
    seconds = args.seconds or (0.3 if args.quick else 1.0)
    names = [name for name in args.vectorizers.split(",") if name]
    names += [f"packrl mp spin {s}" for s in args.spins.split(",") if s]
    names += [f"packrl mp split {s}" for s in args.splits.split(",") if s]
    print(machine_line(("stable_baselines3",)))
    print("Machine shared with other jobs: compare ratios within one run, not absolute numbers across runs.")
    print(f"agent-steps/s, median of {args.repeats} x {seconds}s (min..max); ratio = median / gym Sync median")
    print(f"{'env':26} {'n':>3} {'vectorizer':22} {'median':>10} {'min..max':>21} {'x Sync':>7} {'x serial':>8}")
    for env_name in args.envs.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            other: dict[str, list[float]] = {}
            if args.interleave:
                results = interleaved(names, ENVS[env_name], n, seconds, args.repeats, other)
            else:
                results = {name: agent_steps_per_s(name, ENVS[env_name], n, seconds, args.repeats) for name in names}
            sync = statistics.median(results["gym Sync"]) if "gym Sync" in results else float("nan")
            serial = statistics.median(results["packrl serial"]) if "packrl serial" in results else float("nan")
            for name, rates in results.items():
                med = statistics.median(rates)
                print(f"{env_name:26} {n:>3} {name:22} {med:>10.0f} {min(rates):>10.0f}..{max(rates):<10.0f} "
                      f"{med / sync:>7.2f} {med / serial:>8.2f}", flush=True)
                if args.interleave:  # the rounds in order (a bimodal row shows as two clusters), each @ the
                    # cores other jobs used meanwhile
                    print(f"{'':31}rounds k@other cores: " + " ".join(
                        f"{r / 1e3:.0f}@{o:.1f}" for r, o in zip(rates, other[name])), flush=True)


if __name__ == "__main__":
    main()
