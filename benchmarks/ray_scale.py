"""When Ray pays on one machine, and what a lost actor costs: a 1 ms env on the serial, multiprocessing and Ray
backends side by side, then a run under actor kills.

Part 1, scaling: --envs envs of an env whose step takes 1 ms (``--wait busy``: it spins, as a simulator's CPU
work; ``--wait sleep``: it sleeps, as an env waiting on something outside the process), stepped by serial, by
multiprocessing with 1, 2 and 4 workers and by Ray with 1, 2 and 4 actors; agent-steps/s, the median of
--repeats runs of --seconds, and the ratio to serial. The same for CartPole-v1 (a 20 us env) shows the other
end: there IPC, not the env, is the cost.

Part 2, restarts under load: --kill-steps agent steps of the 1 ms env on Ray (--envs envs, 2 actors), one actor
killed with ``ray.kill`` every --kill-every agent steps (alternating actors), against the same run without kills.
It reports whether the run completed, the restarts, the episodes cut (the killed actor's envs, each counted as
truncated on the step the loss is seen: the ``actor_restarted`` info), the steps lost (the step in flight of
the killed block, and the progress of the cut episodes) and the throughput.

Usage: python benchmarks/ray_scale.py [--seconds 2] [--repeats 3] [--envs 8] [--wait busy|sleep]
Ray starts a local cluster with 4 logical CPUs (the actors share the machine's cores).
"""
from __future__ import annotations

import argparse
import statistics
import time

import gymnasium
import numpy as np
from common import machine_line
from gymnasium import spaces

from packrl import vector


class OneMsEnv(gymnasium.Env):
    """4 floats of observation, 2 actions, episodes of 200 steps (truncated); each step takes ``ms`` ms."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, ms: float = 1.0, wait: str = "busy"):
        self.ms, self.wait, self.t = ms, wait, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        if self.wait == "sleep":
            time.sleep(self.ms / 1e3)
        else:
            end = time.perf_counter() + self.ms / 1e3
            while time.perf_counter() < end:
                pass
        self.t += 1
        obs = np.full(4, (self.t % 100) / 100, np.float32)
        return obs, 1.0, False, self.t >= 200, {}


class Creator:
    """Picklable creator of OneMsEnv (travels to the actors by value: this file is __main__)."""

    def __init__(self, wait: str):
        self.wait = wait

    def __call__(self) -> OneMsEnv:
        return OneMsEnv(1.0, self.wait)


def cartpole():
    return gymnasium.make("CartPole-v1")


def make(backend: str, creator, n: int, workers: int, **kwargs):
    if backend == "serial":
        return vector.make(creator, n)
    if backend == "multiprocessing":
        return vector.make(creator, n, backend="multiprocessing", num_workers=workers, main_envs=0, context="fork")
    return vector.make(creator, n, backend="ray", num_workers=workers, **kwargs)


def rates(backend: str, creator, n: int, workers: int, seconds: float, repeats: int) -> list[float]:
    venv = make(backend, creator, n, workers)
    venv.reset(seed=0)
    actions = np.zeros(n, np.int64)
    for _ in range(5):
        venv.step(actions)
    out = []
    for _ in range(repeats):
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            venv.step(actions)
            steps += 1
        out.append(steps * n / (time.perf_counter() - start))
    venv.close()
    return out


def under_kills(creator, n: int, workers: int, total: int, kill_every: int | None) -> dict:
    """``total`` agent steps on Ray, an actor killed every ``kill_every`` agent steps (None: never)."""
    import ray

    venv = make("ray", creator, n, workers, max_restarts=total // (kill_every or total) + 1)
    venv.reset(seed=0)
    actions = np.zeros(n, np.int64)
    length = np.zeros(n, np.int64)  # steps of each env's current episode
    kills = cut_counted = cut_seen = natural_ends = lost_progress = 0
    steps, next_kill, start = 0, kill_every, time.perf_counter()
    while steps < total:
        if next_kill is not None and steps >= next_kill:
            ray.kill(venv.actors[kills % workers])
            kills += 1
            next_kill += kill_every
        _, _, term, trunc, infos = venv.step(actions)
        steps += n
        length += 1
        restarted = np.array(["actor_restarted" in info for info in infos])
        cut_seen += int(restarted.sum())
        cut_counted += int((trunc & restarted).sum())
        lost_progress += int((length[restarted] - 1).sum())  # the episode's steps before the lost one
        natural_ends += int(((term | trunc) & ~restarted).sum())
        length[term | trunc] = 0
    seconds = time.perf_counter() - start
    restarts = venv.restarts
    venv.close()
    # Each restart cuts the episodes of one actor's envs: every one of them must come back truncated.
    return {"kills": kills, "restarts": restarts, "steps": steps, "seconds": seconds, "rate": steps / seconds,
            "cut_expected": restarts * (n // workers), "cut_counted": cut_counted, "cut_seen": cut_seen,
            "natural_ends": natural_ends, "lost_in_flight": cut_seen, "lost_progress": lost_progress}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--wait", choices=("busy", "sleep"), default="busy")
    parser.add_argument("--kill-steps", type=int, default=20_000)
    parser.add_argument("--kill-every", type=int, default=2_000)
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    print(machine_line(("ray",)))
    print("Machine shared with other jobs: compare ratios within one run, not absolute numbers across runs.")
    import ray

    tic = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    print(f"ray.init: {time.perf_counter() - tic:.1f} s (4 logical CPUs); {args.envs} envs; median of "
          f"{args.repeats} x {args.seconds:g} s")
    n = args.envs
    if not args.skip_scaling:
        envs = {f"1 ms ({args.wait})": Creator(args.wait), "CartPole-v1": cartpole}
        print("| env | backend | workers | agent-steps/s (min..max) | x serial |")
        print("|---|---|---|---|---|")
        for name, creator in envs.items():
            serial = None
            for backend, workers in (("serial", 1), ("multiprocessing", 1), ("multiprocessing", 2),
                                     ("multiprocessing", 4), ("ray", 1), ("ray", 2), ("ray", 4)):
                got = rates(backend, creator, n, workers, args.seconds, args.repeats)
                median = statistics.median(got)
                serial = serial or median
                shown = "-" if backend == "serial" else workers
                print(f"| {name} | {backend} | {shown} | {median:,.0f} ({min(got):,.0f}..{max(got):,.0f}) | "
                      f"{median / serial:.2f} |", flush=True)
    print(f"\nRestarts under load: {args.kill_steps:,} agent steps of the 1 ms ({args.wait}) env, {n} envs on 2 "
          f"Ray actors, one actor killed (ray.kill) every {args.kill_every:,} agent steps")
    print("| run | completed | kills | restarts | agent steps | seconds | agent-steps/s | cut episodes "
          "(counted truncated / expected) | other episode ends | steps lost: in flight | steps lost: cut progress |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, every in (("no kills", None), (f"kill every {args.kill_every:,}", args.kill_every)):
        r = under_kills(Creator(args.wait), n, 2, args.kill_steps, every)
        print(f"| {label} | yes | {r['kills']} | {r['restarts']} | {r['steps']:,} | {r['seconds']:.1f} | "
              f"{r['rate']:,.0f} | {r['cut_counted']} / {r['cut_expected']} | {r['natural_ends']} | "
              f"{r['lost_in_flight']} | {r['lost_progress']:,} |", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
