"""What gymnasium's dict-of-arrays infos (vector.make(..., infos="dict")) cost against packrl's list of
dicts (the default), with gymnasium's SyncVectorEnv (same-step autoreset) as the anchor, side by side.

Envs: CartPole-v1 (no infos; an episode end every ~20 steps per env, where the dict form adds final_obs
and final_info) and ScriptedEnv (a Dict observation, an episode end every 3-6 steps per env, reset infos
every third episode): the dict form's work grows with the ends and infos per step. Each cell: us per
vector step, median of --repeats runs of --seconds, the three measured in turn within each repeat (actions
0 or 1 for both envs); "+us" is dict minus list.
Also the conversion alone (packrl.vector.infos.to_dict) for 64 envs with 0, 8 and 64 episode ends.

Usage: python benchmarks/infos.py [--seconds 1] [--repeats 5] [--envs 8]
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
from packrl.vector.infos import to_dict
from packrl.vector.testing import ScriptedEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, per_call_us, us_per_step

ENVS = {"CartPole-v1": functools.partial(gymnasium.make, "CartPole-v1"), "ScriptedEnv (Dict)": ScriptedEnv}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--envs", type=int, default=8)
    args = parser.parse_args()
    n = args.envs
    print(machine_line())
    print("Machine shared with other jobs: compare within one run, not absolute numbers across runs.")
    print(f"us per vector step of {n} envs (serial backend), median of {args.repeats} x {args.seconds:g} s (min..max)")
    print(f"{'env':20} {'packrl infos=list':>22} {'packrl infos=dict':>22} {'+us':>6} {'gym Sync SAME_STEP':>22}")
    for name, creator in ENVS.items():
        cells = us_per_step({
            "list": lambda: vector.make(creator, n),
            "dict": lambda: vector.make(creator, n, infos="dict"),
            "sync": lambda: SyncVectorEnv([creator] * n, autoreset_mode=AutoresetMode.SAME_STEP),
        }, n, args.seconds, args.repeats)
        med = {k: statistics.median(v) for k, v in cells.items()}
        shown = {k: f"{med[k]:.1f} ({min(v):.1f}..{max(v):.1f})" for k, v in cells.items()}
        print(f"{name:20} {shown['list']:>22} {shown['dict']:>22} {med['dict'] - med['list']:>6.1f} {shown['sync']:>22}")
    print("to_dict alone, 64 envs of 12-byte rows, us per call (median of 7):")
    rows = np.zeros((64, 12), np.uint8)
    for ended_count in (0, 8, 64):
        ended = np.zeros(64, bool)
        ended[:ended_count] = True
        infos = [{"reset_info": {"episode": 2}} if e else {} for e in ended]
        med, spread = per_call_us(lambda: to_dict(infos, ended, rows))
        print(f"  {ended_count:>2} episode ends: {med:8.1f} us (spread {spread:.1f})")


if __name__ == "__main__":
    main()
