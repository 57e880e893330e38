"""What a person sees while a sweep runs: a live table of the trials (state, value, the parameters that differ
between trials, agent steps, elapsed time) with an ETA in a terminal; piped into a log, one line per trial that
starts or ends, with the same counts and ETA; the whole table at the end either way."""
from __future__ import annotations

import datetime
import json
import re
import time
from pathlib import Path
from typing import Any

from optuna.trial import TrialState
from rich.live import Live
from rich.table import Table

from packrl.sweep.trials import OWNER, counts

SHOWN_TRIALS = 30
"""The live table shows the newest trials and the best ones, at most this many rows."""


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


def clock(seconds: float | None) -> str:
    return "?" if seconds is None else str(datetime.timedelta(seconds=int(max(seconds, 0))))


def last_step(folder: Path) -> int | None:
    """The agent steps of a running trial: the last line of its history.jsonl."""
    try:
        with open(folder / "history.jsonl", "rb") as f:
            f.seek(0, 2)
            f.seek(max(f.tell() - 4096, 0))
            lines = f.read().splitlines()
        return int(json.loads(lines[-1])["global_step"]) if lines else None
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def elapsed(trial: Any) -> float | None:
    if trial.datetime_start is None:
        return None
    end = trial.datetime_complete or datetime.datetime.now()
    return (end - trial.datetime_start).total_seconds()


def differing(trials: list) -> list[str]:
    """The parameters whose values differ between ``trials``."""
    names: dict[str, set] = {}
    for t in trials:
        for k, v in t.params.items():
            names.setdefault(k, set()).add(repr(v))
    return [k for k, values in names.items() if len(values) > 1 or len(trials) == 1]


def fill(table: Table, names: tuple[str, ...], rows: list[list[str]]) -> Table:
    """``table`` with these columns and rows: headers are the names less their section (``train.gamma`` ->
    ``gamma``, ``1-train.gamma`` -> ``1-gamma``) where no other column has the same key; a narrow terminal cuts
    a header before any value."""
    keys = [re.sub(r"\b(train|policy|vec|env)\.", "", name) for name in names]
    for c, (name, key) in enumerate(zip(names, keys)):
        widest = max((len(row[c]) for row in rows), default=1)
        table.add_column(key if keys.count(key) == 1 else name, justify="left" if name == "state" else "right",
                         min_width=widest)
    for row in rows:
        table.add_row(*row)
    return table


class TrialView:
    """The live table (a terminal) or the log lines (piped) of one sweep."""

    def __init__(self, sweep: Any, console: Any, live: bool = True):
        self.sweep, self.console = sweep, console
        self.live = None
        self.use_live = live and console.is_terminal
        self.seen: dict[int, str] = {}

    def __enter__(self) -> TrialView:
        if self.use_live:
            self.live = Live(Table(), console=self.console, refresh_per_second=2, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def eta(self, trials: list) -> float | None:
        """Seconds until the study holds ``--trials`` finished trials, from the mean wall time of this sweep's
        finished trials (before there is one, from the running trials' progress)."""
        options, running = self.sweep.options, self.sweep.running
        walls = [elapsed(t) for t in trials if t.state == TrialState.COMPLETE and t.system_attrs.get(OWNER) == self.sweep.owner]
        walls = [w for w in walls if w]
        now = time.monotonic()
        estimate = sum(walls) / len(walls) if walls else None
        left = 0.0
        for r in running.values():
            spent, step = now - r.started, last_step(r.folder)
            per_trial = estimate or (spent * options.budget / step if step else None)
            if per_trial is None:
                return None
            left += max(per_trial - spent, 0.0)
        done, active = counts(trials)
        to_start = max(options.trials - done - active, 0)
        if to_start and estimate is None:
            return None
        return (left + to_start * (estimate or 0.0)) / max(options.jobs, 1)

    def heading(self, trials: list) -> str:
        done, active = counts(trials)
        o = self.sweep.options
        return (f"packrl sweep {o.env}: study {o.study}, {done}/{o.trials} finished, {active} running, "
                f"elapsed {clock(time.monotonic() - self.sweep.started)}, ETA {clock(self.eta(trials))}")

    def table(self, trials: list, title: str | None = None) -> Table:
        direction = self.sweep.options.objective.direction
        complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        best = sorted(complete, key=lambda t: t.value, reverse=direction == "maximize")[:5]
        shown = sorted({t.number: t for t in [*trials[-SHOWN_TRIALS:], *best]}.values(), key=lambda t: t.number)
        params = differing(shown)
        rows = []
        for t in shown:
            steps = t.user_attrs.get("agent_steps")
            if t.state == TrialState.RUNNING and t.number in self.sweep.running:
                steps = last_step(self.sweep.running[t.number].folder)
            state = t.state.name.lower() + (" (cut)" if t.user_attrs.get("failure") == "cut" else "")
            rows.append([str(t.number), state, fmt(t.value), f"{steps:,}" if steps else "-", clock(elapsed(t)),
                         *[fmt(t.params.get(p)) for p in params]])
        return fill(Table(title=title, title_justify="left"), ("trial", "state", "value", "steps", "elapsed", *params),
                    rows)

    def update(self, trials: list) -> None:
        if self.live is not None:
            self.live.update(self.table(trials, self.heading(trials)))
            return
        for t in trials:  # piped: one line per trial of this sweep that starts or ends
            if t.number not in self.sweep.running and t.number not in self.seen:
                continue
            state = t.state.name.lower()
            if self.seen.get(t.number) == state:
                continue
            self.seen[t.number] = state
            if state == "running":
                what = ", ".join(f"{k}={fmt(v)}" for k, v in t.params.items())
                line = f"trial {t.number} started: {what}"
            else:
                why = t.user_attrs.get("cut") or t.user_attrs.get("failure") or ""
                line = (f"trial {t.number} {state}" + (f" value {fmt(t.value)}" if t.value is not None else "")
                        + (f" ({why})" if why and state == "fail" else "")
                        + f", {t.user_attrs.get('agent_steps') or 0:,} steps in {clock(elapsed(t))}")
            self.console.print(f"{line} | {self.heading(trials)}", highlight=False, soft_wrap=True, markup=False)

    def summary(self, trials: list, best: Any) -> None:
        self.console.print(self.table(trials, self.heading(trials)))
        if best is not None:
            self.console.print(f"best: trial {best['number']}, value {fmt(best['value'])}; settings in "
                               f"{best['file']} (packrl train --config {best['file']})", highlight=False,
                               soft_wrap=True)
