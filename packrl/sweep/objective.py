"""What a sweep optimizes, from a trial's history rows: the mean return at the budget (maximized) or the agent
steps to reach a return threshold, capped at the budget (minimized); and the value a trial reports each
``1/REPORTS`` of its budget, so a pruner compares every trial at the same agent steps."""
from __future__ import annotations

import math
from dataclasses import dataclass

from packrl.errors import ConfigError

REPORTS = 20
"""Points per trial at which intermediate values are reported (every budget / REPORTS agent steps)."""
FINAL_SHARE = 0.1
"""The return objective averages the iterations in the last tenth of the budget (at least the last one)."""
RECENT = 3
"""Iterations with episodes averaged for an intermediate value."""
WINDOW = 20
"""Episodes in the moving mean that ``steps-to`` compares with its threshold (as benchmarks/learning.py and rl-zoo
judge a run): one iteration's mean can rest on one lucky episode."""


@dataclass(frozen=True)
class Objective:
    """``kind`` ``return`` or ``steps-to`` (with ``threshold``) over ``budget`` agent steps."""

    kind: str
    budget: int
    threshold: float | None = None

    @property
    def direction(self) -> str:
        return "maximize" if self.kind == "return" else "minimize"

    def describe(self) -> dict:
        return {"objective": self.text(), "budget": self.budget}

    def text(self) -> str:
        return "return" if self.kind == "return" else f"steps-to:{self.threshold:g}"

    def value(self, rows: list[dict]) -> float | None:
        """A finished trial's value; None when no episode ended (there is no return to judge)."""
        if self.kind == "return":
            return final_return(rows)
        reached = steps_to(rows, self.threshold)
        return float(min(reached, self.budget)) if reached is not None else float(self.budget)

    def intermediate(self, rows: list[dict]) -> float | None:
        """The value reported while a trial runs: the recent mean return, or the steps at which the threshold was
        reached (before that, the budget plus the distance still to go, so farther trials rank worse)."""
        recent = recent_return(rows)
        if self.kind == "return":
            return recent
        reached = steps_to(rows, self.threshold)
        if reached is not None:
            return float(reached)
        return None if recent is None else float(self.budget) + max(0.0, self.threshold - recent)


def parse_objective(text: str, budget: int) -> Objective:
    """``return`` or ``steps-to:THRESHOLD``; anything else is a one-line ConfigError."""
    if text == "return":
        return Objective("return", budget)
    kind, _, threshold = text.partition(":")
    if kind == "steps-to":
        try:
            value = float(threshold)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return Objective("steps-to", budget, value)
    raise ConfigError(f"--objective {text!r}: expected return or steps-to:THRESHOLD (a finite return, e.g. steps-to:475)")


def _returns(rows: list[dict]) -> list[tuple[int, float]]:
    return [(int(r["global_step"]), float(r["episode_return"])) for r in rows
            if isinstance(r.get("episode_return"), (int, float)) and math.isfinite(r["episode_return"])]


def final_return(rows: list[dict]) -> float | None:
    """The mean of the iterations' mean returns over the last FINAL_SHARE of the steps taken (at least the last)."""
    returns = _returns(rows)
    if not returns:
        return None
    last_step = int(rows[-1]["global_step"])
    tail = [v for step, v in returns if step > last_step * (1 - FINAL_SHARE)] or [returns[-1][1]]
    return sum(tail) / len(tail)


def recent_return(rows: list[dict]) -> float | None:
    returns = _returns(rows)[-RECENT:]
    return sum(v for _, v in returns) / len(returns) if returns else None


def steps_to(rows: list[dict], threshold: float) -> int | None:
    """The agent steps at the end of the first iteration where the mean return of the last WINDOW finished episodes
    reached ``threshold``, or None. Each history row holds its iteration's mean and episode count (``episodes``;
    a row without one counts as one episode), so the window's oldest iteration counts at its mean for the episodes
    the window still needs."""
    blocks: list[tuple[int, float]] = []  # (episodes, mean return) of the iterations that ended episodes
    for row in rows:
        value = row.get("episode_return")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        episodes = row.get("episodes")
        blocks.append((int(episodes) if isinstance(episodes, int) and episodes > 0 else 1, float(value)))
        total, need = 0.0, WINDOW
        for count, mean in reversed(blocks):
            take = min(count, need)
            total, need = total + take * mean, need - take
            if need == 0:
                break
        if need == 0 and total / WINDOW >= threshold:
            return int(row["global_step"])
    return None


def report_points(budget: int) -> list[int]:
    """The agent steps at which a trial reports: budget * k / REPORTS for k = 1..REPORTS."""
    return [budget * k // REPORTS for k in range(1, REPORTS + 1)]
