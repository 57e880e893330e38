"""What each autoreset mode costs per vector step on packrl's serial and multiprocessing backends, with
gymnasium's SyncVectorEnv in the same mode as the anchor, side by side.

SAME_STEP steps single-agent envs as one block (observations packed leaf by leaf across the block); NEXT_STEP
and DISABLED step env by env (an ended env is reset instead of stepped, or refused), so they may cost more per
step. DISABLED's column includes the ``reset(options={"reset_mask": ...})`` call after each step that ended
an episode, as a user of that mode makes it. Envs: CartPole-v1 (an end every ~20 steps per env) and
ScriptedEnv (a Dict observation, an end every 3-6 steps). Each cell: us per vector step, median of
--repeats runs of --seconds, every column measured in turn within each repeat; "x" is the ratio to packrl's
SAME_STEP on the same backend.

Usage: python benchmarks/autoreset.py [--seconds 1] [--repeats 5] [--envs 8]
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from packrl import vector
from packrl.vector.testing import ScriptedEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, us_per_step

ENVS = {"CartPole-v1": functools.partial(gymnasium.make, "CartPole-v1"), "ScriptedEnv (Dict)": ScriptedEnv}
MODES = ("SAME_STEP", "NEXT_STEP", "DISABLED")


def step_fn(env, disabled: bool):
    """One vector step; with DISABLED, the masked reset of the envs that ended too."""
    def step(actions):
        _, _, terminals, truncations, _ = env.step(actions)
        if disabled:
            ended = np.asarray(terminals) | np.asarray(truncations)
            if ended.any():
                env.reset(options={"reset_mask": ended})
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--envs", type=int, default=8)
    args = parser.parse_args()
    n = args.envs
    print(machine_line())
    print("Machine shared with other jobs: compare within one run, not absolute numbers across runs.")
    print(f"us per vector step of {n} envs, median of {args.repeats} x {args.seconds:g} s (min..max); "
          "x = ratio to packrl SAME_STEP on that backend")
    for env_name, creator in ENVS.items():
        makers = {}
        for mode in MODES:
            makers[f"serial {mode}"] = functools.partial(vector.make, creator, n, autoreset_mode=mode)
            makers[f"multiprocessing {mode}"] = functools.partial(
                vector.make, creator, n, backend="multiprocessing", autoreset_mode=mode)
            makers[f"gym Sync {mode}"] = functools.partial(SyncVectorEnv, [creator] * n,
                                                           autoreset_mode=AutoresetMode[mode])
        cells = us_per_step(makers, n, args.seconds, args.repeats,
                            lambda name, env: step_fn(env, name.endswith("DISABLED")))
        med = {k: statistics.median(v) for k, v in cells.items()}
        print(f"{env_name}:")
        for name, values in cells.items():
            backend = name.rsplit(" ", 1)[0]
            base = med.get(f"{backend} SAME_STEP") if not backend.startswith("gym") else None
            ratio = f"  x{med[name] / base:.2f}" if base else ""
            print(f"  {name:28} {med[name]:9.1f} ({min(values):.1f}..{max(values):.1f}){ratio}")


if __name__ == "__main__":
    main()
