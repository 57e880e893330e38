"""What checking an env's step results costs: ``emulate(env).step`` on benchmarks/emulation.py's
NetHack-like env, side by side with the same step without the reward and flag checks (a subclass
whose ``step`` is the one before ``packrl/emulation/step_checks.py``), interleaved so both see the
same load. Reports the medians and the per-round paired difference.

    .venv/bin/python benchmarks/step_checks.py
"""
from __future__ import annotations

import statistics
import sys
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, print_table
from emulation import NetHackLike

from packrl.emulation.actions import fast_decode
from packrl.emulation.gymnasium_env import AGENT, GymnasiumEmulation, _single

ROUNDS, CALLS = 40, 10_000


class Unchecked(GymnasiumEmulation):
    """The step as it was before the checks: rewards and flags stored as the env gave them."""

    def step(self, actions):
        native = fast_decode(self._action_spec, actions)
        if native is None:
            native = self.emulated.action.checked_decode(_single(actions, self.emulated.action.kind),
                                                         who=f" (agent {AGENT})")
        obs, reward, terminated, truncated, info = self.env.step(native)
        self._packer.pack(obs)  # the row writer step uses: a bound layout, or the pass-through Box row
        self.rewards[0] = reward
        self.terminals[0] = terminated
        self.truncations[0] = truncated
        if terminated or truncated:
            self.final_observations[0] = self.observations[0]
        return self.observations, self.rewards, self.terminals, self.truncations, info


def main() -> None:
    print(machine_line())
    raw, unchecked, checked = NetHackLike(), Unchecked(NetHackLike()), GymnasiumEmulation(NetHackLike())
    for env in (unchecked, checked):
        env.reset()
    action = np.array([3])
    calls = {"raw env.step": lambda: raw.step(3), "emulate step, unchecked": lambda: unchecked.step(action),
             "emulate step, checked (packrl)": lambda: checked.step(action)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, fn in calls.items():
            times[name].append(min(timeit.repeat(fn, number=CALLS, repeat=3)) / CALLS * 1e6)
    raw_t = statistics.median(times["raw env.step"])
    rows = [[name, statistics.median(t), max(t) - min(t), statistics.median(t) - raw_t] for name, t in times.items()]
    print_table(f"step on the NetHack-like env (µs, median of {ROUNDS} rounds, each the best of 3 x {CALLS} calls)",
                ["", "median µs", "spread µs", "added µs"], rows)
    diffs = sorted(c - u for c, u in zip(times["emulate step, checked (packrl)"], times["emulate step, unchecked"], strict=True))
    print(f"checked - unchecked, paired per round: median {statistics.median(diffs):+.3f} µs, "
          f"quartiles {diffs[len(diffs) // 4]:+.3f} .. {diffs[3 * len(diffs) // 4]:+.3f} µs")


if __name__ == "__main__":
    main()
