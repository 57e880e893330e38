"""Serial loop or threads, chosen while the env runs: ``threads=None``'s choice for large batches.

A fork-join step is only as fast as its slowest thread. On an idle 2-core machine 2 threads step 4096 CartPoles
about 1.5x faster than the serial loop, but where another process holds a core, the thread that waits for it holds
every step up (0.05x of the serial loop, benchmarks/README.md). No static rule knows which case holds, and it
changes while a run goes on, so :class:`ThreadChoice` times both: it runs one kernel (the *current*) and, after
``period`` steps, a few steps of the other (a *probe*). The faster by a margin becomes current. A lost probe
doubles the period (up to ``max_period``), so a probe that lost costs less and less; a current kernel whose recent
steps got much slower than when it won triggers a probe at once, so a load that starts mid-run is noticed within
a few steps. Both kernels compute the same thing (per-copy random streams), so the choice never changes results.
"""
from __future__ import annotations

import statistics
from collections import deque

SERIAL = 1


class ThreadChoice:
    """Which kernel, serial (``1``) or ``threads`` threads, runs the next step, from the step times it is told.

    Call :meth:`pick` before a step and :meth:`record` with the kernel and the seconds it took after it. The logic
    only compares times it was given, so it is tested with made-up times (tests/test_numba_thread_choice.py)."""

    def __init__(self, threads: int, period: int = 32, max_period: int = 4096, probe: int = 3,
                 margin: float = 1.1, window: int = 8, slowdown: float = 2.0, lost_early: float = 3.0):
        if threads < 2:
            raise ValueError(f"ThreadChoice needs threads >= 2, got {threads}")
        self.threads, self.base_period, self.max_period = threads, period, max_period
        self.probe_steps, self.margin, self.slowdown, self.lost_early = probe, margin, slowdown, lost_early
        self.current = threads  # the idle machine's winner; the first probe checks it
        self.period = period
        self.recent: deque[float] = deque(maxlen=window)  # the current kernel's last step times
        self.won_at: float | None = None  # the current kernel's median step time when it last won (None: no probe yet)
        self.since_probe = 0
        self.probing: list[float] | None = None  # the other kernel's times during a probe
        self.switches = 0

    @property
    def other(self) -> int:
        return SERIAL if self.current != SERIAL else self.threads

    def pick(self) -> int:
        """The kernel for the next step: ``1`` (serial loop) or ``threads``."""
        return self.other if self.probing is not None else self.current

    def record(self, kernel: int, seconds: float) -> None:
        """The step just run by ``kernel`` took ``seconds``."""
        if self.probing is not None and kernel == self.other:
            self.probing.append(seconds)
            mine = self._median()
            lost = mine is not None and seconds > self.lost_early * mine  # no need to see more of it
            if lost or len(self.probing) >= self.probe_steps:
                self._decide()
            return
        if kernel != self.current:
            return  # a step run outside the choice (not expected): nothing to learn from
        self.recent.append(seconds)
        self.since_probe += 1
        if self.won_at is None:  # the first probe, as soon as the current kernel has a few times
            due = len(self.recent) >= self.probe_steps
        else:
            slowed = len(self.recent) == self.recent.maxlen and self._median() > self.slowdown * self.won_at
            due = self.since_probe >= self.period or slowed
        if due:
            self.probing = []

    def _median(self) -> float | None:
        return statistics.median(self.recent) if self.recent else None

    def _decide(self) -> None:
        theirs, mine = statistics.median(self.probing), self._median()
        self.probing_times, self.probing, self.since_probe = self.probing, None, 0
        if mine is None or theirs * self.margin < mine:
            self.current = self.other
            self.switches += 1
            self.recent.clear()
            self.recent.extend(self.probing_times)
            self.won_at = theirs
            self.period = self.base_period
        else:
            self.won_at = mine
            self.period = min(2 * self.period, self.max_period)

    def __repr__(self) -> str:
        return f"ThreadChoice(current={self.current}, period={self.period}, switches={self.switches})"
