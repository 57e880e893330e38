"""Multi-agent emulation cost: raw PettingZoo env vs packrl's emulate(env) vs SuperSuit's padding path.

Rows (steps/s for Parallel envs, turns/s for connect four; median of several interleaved repeats):
- KAZ (knights_archers_zombies_v11, parallel, agents die): raw | packrl | SuperSuit black_death_v3
- MPE2 simple_adversary (parallel, observation shapes differ by role): raw | packrl | SuperSuit
  pad_observations_v0
- connect_four_v3 (AEC, turn based): raw agent_iter loop | packrl. SuperSuit's padding wrappers do
  not apply (not parallelizable; black_death needs a Parallel env).

Every variant runs the same action sequence and resets when its episode ends. Target: packrl adds
at most 15% to the raw step on KAZ. Usage: python benchmarks/multiagent.py [--repeats 5] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

warnings.filterwarnings("ignore", category=DeprecationWarning)

from mpe2 import simple_adversary_v3  # noqa: E402
from pettingzoo.butterfly import knights_archers_zombies_v11  # noqa: E402
from pettingzoo.classic import connect_four_v3  # noqa: E402
from supersuit import black_death_v3, pad_observations_v0  # noqa: E402

from packrl.emulation import emulate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line  # noqa: E402

# ---------------------------------------------------------------- Parallel loops


def raw_parallel(make: Callable, actions: np.ndarray) -> float:
    """Steps/s of the raw env, fed a dict of python ints for env.agents (what a user writes)."""
    env = make()
    env.reset(seed=0)
    row = {a: i for i, a in enumerate(env.possible_agents)}
    plain = actions.tolist()
    start = time.process_time()
    for step in plain:
        env.step({a: step[row[a]] for a in env.agents})
        if not env.agents:
            env.reset()
    return len(plain) / (time.process_time() - start)


OWN_SHARE: dict = {}  # per packrl case: packrl's own time / the time spent inside the env, per run


def timed(obj: object, names: tuple, spent: list) -> None:
    """Count the CPU time of calls to ``obj.<name>`` (the env's own work) into ``spent[0]``."""
    for name in names:
        original = getattr(obj, name)

        def call(*args, _original=original, **kwargs):
            start = time.process_time()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[0] += time.process_time() - start
        setattr(obj, name, call)


def packrl_parallel(make: Callable, actions: np.ndarray, key: str = "") -> float:
    """Steps/s through emulate(env): one int64 array of actions per step, rows written in place.
    Also records packrl's own time relative to the env's step and reset, measured in the same run
    (robust to other jobs on the machine, unlike a comparison of two runs)."""
    env = emulate(make())
    spent = [0.0]
    timed(env.env, ("step", "reset"), spent)
    env.reset(seed=0)
    spent[0] = 0.0
    start = time.process_time()
    for step in actions:
        env.step(step)
        if env.done:
            env.reset()
    total = time.process_time() - start
    OWN_SHARE.setdefault(key, []).append((total - spent[0]) / spent[0])
    return len(actions) / total


# ---------------------------------------------------------------- AEC loops

def legal(mask: np.ndarray, k: int) -> int:
    choices = np.flatnonzero(mask)
    return int(choices[k % len(choices)])


def raw_aec(make: Callable, picks: np.ndarray) -> float:
    """Live turns/s of PettingZoo's own loop: last(), step(None) for ended agents, reset at the end."""
    env = make()
    env.reset(seed=0)
    turns = 0
    start = time.process_time()
    while turns < len(picks):
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            if not env.agents:
                env.reset()
            continue
        env.step(legal(obs["action_mask"], int(picks[turns])))
        turns += 1
    return turns / (time.process_time() - start)


def packrl_aec(make: Callable, picks: np.ndarray, key: str = "") -> float:
    """Live turns/s through emulate(env): one step per turn, the mask read from the packed rows
    (packrl's own share measured against the env's step, last and reset, as for Parallel)."""
    env = emulate(make())
    spent = [0.0]
    timed(env.env, ("step", "last", "reset"), spent)
    group = env.emulated.groups[0]
    masks = group.observation.unpack(env.observations)[group.action_mask[0]]  # views into the rows
    actions = np.zeros(env.num_agents, np.int64)
    env.reset(seed=0)
    spent[0] = 0.0
    start = time.process_time()
    for pick in picks:
        row = env.acting_row
        tick = time.process_time()
        actions[row] = legal(masks[row], int(pick))
        spent[0] += time.process_time() - tick  # the raw loop picks moves too: not packrl's time
        env.step(actions)
        if env.done:
            env.reset()
    total = time.process_time() - start
    OWN_SHARE.setdefault(key, []).append((total - spent[0]) / spent[0])
    return len(picks) / total


# ---------------------------------------------------------------- table

def measure(cases: list, repeats: int) -> list:
    """Run every (env, variant) once per repeat, interleaved so load changes hit all alike, after
    one short warm-up run each (imports, compiled checks, first resets)."""
    for _, _, run, data in cases:
        run(data[:20])
    rates: dict = {(env, variant): [] for env, variant, _, _ in cases}
    for _ in range(repeats):
        for env, variant, run, data in cases:
            rates[(env, variant)].append(run(data))
    return [(env, variant, statistics.median(rates[(env, variant)]), rates[(env, variant)]) for env, variant, _, _ in cases]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a few hundred steps per run (smoke test)")
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    rng = np.random.default_rng(0)
    kaz_actions = rng.integers(6, size=(int(800 * scale), 4))
    mpe_actions = rng.integers(5, size=(int(4000 * scale), 3))
    picks = rng.integers(7, size=int(3000 * scale))
    kaz, mpe = knights_archers_zombies_v11.parallel_env, simple_adversary_v3.parallel_env
    black_death, padded = (lambda: black_death_v3(kaz())), (lambda: pad_observations_v0(mpe()))
    cases = [
        ("KAZ (parallel)", "raw", lambda a: raw_parallel(kaz, a), kaz_actions),
        ("KAZ (parallel)", "packrl emulate", lambda a: packrl_parallel(kaz, a, "KAZ"), kaz_actions),
        ("KAZ (parallel)", "supersuit black_death", lambda a: raw_parallel(black_death, a), kaz_actions),
        ("MPE2 simple_adversary", "raw", lambda a: raw_parallel(mpe, a), mpe_actions),
        ("MPE2 simple_adversary", "packrl emulate", lambda a: packrl_parallel(mpe, a, "MPE2 simple_adversary"), mpe_actions),
        ("MPE2 simple_adversary", "supersuit pad_observations", lambda a: raw_parallel(padded, a), mpe_actions),
        ("connect_four (AEC, turns)", "raw", lambda p: raw_aec(connect_four_v3.env, p), picks),
        ("connect_four (AEC, turns)", "packrl emulate", lambda p: packrl_aec(connect_four_v3.env, p, "connect_four"), picks),
    ]
    results = measure(cases, args.repeats)
    raw = {env: rate for env, variant, rate, _ in results if variant == "raw"}
    print(machine_line(("supersuit", "pymunk", "mpe2")))
    print("(a shared machine: other jobs may run alongside; ratios come from interleaved repeats)")
    print(f"{'env':28s} {'variant':28s} {'steps/s':>10s} {'vs raw':>8s} {'added time':>11s}  runs")
    for env, variant, rate, runs in results:
        ratio = rate / raw[env]
        added = raw[env] / rate - 1.0  # extra time per step relative to the raw step
        spread = ", ".join(f"{r:.0f}" for r in runs)
        print(f"{env:28s} {variant:28s} {rate:10.0f} {ratio:8.3f} {added:+10.1%}  [{spread}]")
    print("packrl's own time per step relative to the env's own calls (step, reset; AEC: also last), "
          "measured inside each run (median over repeats):")
    for key, shares in OWN_SHARE.items():
        runs = shares[1:]  # the first entry is the warm-up run
        print(f"  {key:24s} {statistics.median(runs):+7.1%}  [{', '.join(f'{x:+.1%}' for x in runs)}]")
    kaz = statistics.median(OWN_SHARE["KAZ"][1:])
    print(f"KAZ: packrl adds {kaz:+.1%} to the raw step (target <= +15%): {'met' if kaz <= 0.15 else 'NOT met'}")


if __name__ == "__main__":
    main()
