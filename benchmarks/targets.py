"""Issue 21's targets as the benchmarks check them: one row per target (goal, measured, met) and, for a target
not met, its gap in the run's own numbers. Pure arithmetic on measured figures (nothing here times anything),
so a test can hand it numbers on either side of a target."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from common import print_table


@dataclass(frozen=True)
class Target:
    name: str
    goal: str
    measured: str
    met: bool
    gap: tuple[str, ...] = ()


@dataclass(frozen=True)
class Split:
    """Where a run's wall time went: ``total`` seconds for ``steps`` agent steps over ``iterations`` iterations,
    of which ``rollout`` and ``update`` (advantages included) seconds; ``minibatches``: gradient steps taken.
    Rollout and update are NaN where the contender does not report them (SB3)."""

    total: float
    steps: int
    iterations: int
    rollout: float = math.nan
    update: float = math.nan
    minibatches: int = 0

    @property
    def other(self) -> float:
        """Seconds outside rollouts and updates (construction, bookkeeping between iterations)."""
        return self.total - self.rollout - self.update

    @property
    def rate(self) -> float:
        return self.steps / self.total

    def per_iteration_ms(self) -> tuple[float, float, float, float]:
        """(total, rollout, update, other) milliseconds per iteration."""
        n = self.iterations
        return tuple(1e3 * v / n for v in (self.total, self.rollout, self.update, self.other))


class Outcome(Protocol):
    """What a seed's run reports (benchmarks/learning.py's Result)."""

    steps: int | None  # agent steps when the threshold was first met; None: not within the budget
    last_mean: float
    eval_mean: float
    total_steps: int  # the steps the run took (its budget)


def median_index(values: Sequence[float]) -> int:
    """The index of the median value (the lower middle one for an even count): a run, so its parts add up."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(order) - 1) // 2]


def seeds_target(name: str, threshold: float, max_steps: int, outcomes: dict[int, Outcome],
                 eval_too: bool) -> Target:
    """Every seed meets ``threshold`` within ``max_steps`` agent steps (and, with ``eval_too``, its greedy eval at
    the end of the budget does too). The gap names each seed that did not, with the figure that missed."""
    missed = []
    for seed, r in outcomes.items():
        if r.steps is None or r.steps > max_steps:
            when = f"not within its {r.total_steps:,} steps" if r.steps is None else f"only at {r.steps:,} steps"
            missed.append(f"seed {seed}: {when}; final moving mean {r.last_mean:.3f}, final eval {r.eval_mean:.3f}")
        elif eval_too and r.eval_mean < threshold:
            missed.append(f"seed {seed}: met at {r.steps:,} steps, but the final greedy eval is {r.eval_mean:.3f} "
                          f"< {threshold:g}")
    solved = len(outcomes) - len(missed)
    goal = f">= {threshold:g}{' (training and eval)' if eval_too else ''} within {max_steps:,} steps, every seed"
    return Target(name, goal, f"{solved}/{len(outcomes)} seeds", not missed and bool(outcomes), tuple(missed))


def wall_target(name: str, limit: float, run: Split, anchor: str = "") -> Target:
    """Wall seconds to threshold of the median run against ``limit``; the gap splits the run's seconds and
    says what the updates (per minibatch) or an agent step (all in) would have to cost to fit."""
    met = run.total <= limit
    measured = f"{run.total:.2f} s" + (f" ({anchor})" if anchor else "")
    if met:
        return Target(name, f"<= {limit:.2f} s", measured, True)
    gap = [f"median run: {run.total:.2f} s to threshold at {run.steps:,} steps = rollouts {run.rollout:.2f} s + "
           f"updates {run.update:.2f} s ({run.minibatches:,} minibatches, {run.update / run.minibatches * 1e3:.2f} ms "
           f"each) + other {run.other:.2f} s"]
    room = limit - run.rollout - run.other
    if room > 0:
        gap.append(f"{limit:.2f} s at the same steps needs updates <= {room:.2f} s: {room / run.minibatches * 1e3:.3f} ms "
                   f"per minibatch ({run.update / room:.2f}x cheaper), rollouts and other as measured")
    else:
        gap.append(f"rollouts + other alone take {run.rollout + run.other:.2f} s: free updates would still miss "
                   f"{limit:.2f} s by {-room:.2f} s")
    per_step = run.total / run.steps
    fits = limit / per_step
    gap.append(f"or, at this run's {per_step * 1e6:.0f} us per agent step (all in), solving within {fits:,.0f} steps "
               f"({run.steps / fits:.2f}x fewer than {run.steps:,})")
    return Target(name, f"<= {limit:.2f} s", measured, False, tuple(gap))


def wall_ratio_target(name: str, ratio: float, anchor_name: str, anchor_seconds: float, anchor_steps: int | None,
                      run: Split) -> Target:
    """Wall to threshold <= ``ratio`` x the anchor's (median) wall: ``wall_target`` at that many seconds."""
    limit = ratio * anchor_seconds
    at = f" at {anchor_steps:,} steps" if anchor_steps else ""
    target = wall_target(name, limit, run, f"{run.total / anchor_seconds:.2f}x {anchor_name}'s {anchor_seconds:.2f} s")
    gap = target.gap and (f"{anchor_name}: {anchor_seconds:.2f} s to threshold{at}; {ratio:g}x is {limit:.2f} s",
                          *target.gap)
    return Target(name, f"<= {ratio:g}x {anchor_name}", target.measured, target.met, gap)


def rate_target(name: str, ratio: float, anchor_name: str, anchor: Split, ours: Split,
                floors: Sequence[tuple[str, float]] = ()) -> Target:
    """Steps/s of ``ours`` >= ``ratio`` x ``anchor``'s. The gap, per iteration of the anchor's size: both splits,
    the time packrl's iteration would need, the ratio reachable with its rollout or its update free, and for each
    floor (label, seconds per agent step that the env stepping alone takes) the ratio reachable if everything
    else of packrl cost nothing (Amdahl) and what packrl's part beyond the env would have to cost."""
    measured_ratio = ours.rate / anchor.rate
    measured = f"{measured_ratio:.2f}x ({ours.rate:,.0f} / {anchor.rate:,.0f} steps/s)"
    if measured_ratio >= ratio:
        return Target(name, f">= {ratio:g}x {anchor_name}", measured, True)
    size = anchor.steps / anchor.iterations
    a_total, a_roll, a_upd, a_other = anchor.per_iteration_ms()
    scale = size / (ours.steps / ours.iterations)  # ours per iteration of the anchor's size
    p_total, p_roll, p_upd, p_other = (v * scale for v in ours.per_iteration_ms())
    need = a_total / ratio
    per_mb = ours.minibatches / ours.iterations
    a_mb = f" ({a_upd / (anchor.minibatches / anchor.iterations):.2f} ms per minibatch)" if anchor.minibatches else ""
    gap = [f"per {size:,.0f}-step iteration: {anchor_name} {a_total:.1f} ms = rollout {a_roll:.1f} + update "
           f"{a_upd:.1f}{a_mb} + other {a_other:.1f}; packrl {p_total:.1f} ms = rollout {p_roll:.1f} + update {p_upd:.1f} "
           f"({p_upd / per_mb:.2f} ms per minibatch) + other {p_other:.1f}",
           f"{ratio:g}x needs packrl <= {need:.1f} ms per iteration ({p_total - need:.1f} ms less); with the rollout free "
           f"at most {a_total / (p_total - p_roll):.2f}x, with the update free at most {a_total / (p_total - p_upd):.2f}x"]
    for label, per_step in floors:
        floor = 1e3 * per_step * size
        room = need - floor
        gap.append(f"{label}: {floor:.1f} ms per iteration; with everything else of packrl free at most "
                   f"{a_total / floor:.2f}x; packrl beyond it {p_total - floor:.1f} ms, "
                   + (f"{ratio:g}x needs <= {room:.1f} ms" if room > 0 else f"so {ratio:g}x is out of reach"))
    return Target(name, f">= {ratio:g}x {anchor_name}", measured, False, tuple(gap))


def print_targets(targets: list[Target], title: str = "Targets (issue 21)") -> None:
    """The targets as a table, then each gap's lines under the name of its target."""
    if not targets:
        print(f"{title}: none of the run's tasks has one")
        return
    print_table(title, ["target", "goal", "measured (median)", "met"],
                [[t.name, t.goal, t.measured, "met" if t.met else "NOT met"] for t in targets])
    for t in targets:
        if t.gap:
            print(f"gap, {t.name}:")
            for line in t.gap:
                print(f"  - {line}")
