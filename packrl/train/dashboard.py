"""Training progress a person can read: a live rich view on a terminal (a bar with percentage, ETA and
steps/s above a table of returns and losses), log lines at a time interval elsewhere, and optional
TensorBoard logging. Fed one stats dict per iteration."""
from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

SHOWN = (("sps", "steps/s, last iteration", "{:,.0f}"), ("episode_return", "episode return", "{:.3f}"),
         ("episode_length", "episode length", "{:.1f}"), ("pg_loss", "policy loss", "{:.4f}"),
         ("v_loss", "value loss", "{:.4f}"), ("entropy", "entropy", "{:.4f}"), ("approx_kl", "approx KL", "{:.5f}"),
         ("clipfrac", "clip fraction", "{:.3f}"), ("explained_variance", "explained variance", "{:.3f}"),
         ("learning_rate", "learning rate", "{:.2e}"))
PER_AGENT, VERSUS, PREVIOUS = "episode_return/", "vs_random/", "vs_previous/"
MATCHES = (VERSUS, PREVIOUS)  # two-player zero-sum games: against a random opponent, and the previous check's policy
SELF_PLAY_LABEL = "self-play return (0 in zero-sum)"
LABEL_WIDTH, VALUE_WIDTH = 32, 18
LOGGED = {key for key, _, _ in SHOWN}  # TensorBoard gets these and the per-agent and versus figures


class Dashboard:
    """``with Dashboard(title, total_steps) as d: ppo.train(n, callback=d.update)``. ``live=False`` prints a
    progress line every ``log_seconds`` seconds instead (for logs and non-terminals), and one at the end.
    ``start_step``: where a resumed run starts (progress and ETA count from there)."""

    def __init__(self, title: str, total_steps: int, live: bool = True, tensorboard: str | None = None,
                 log_seconds: float = 5.0, console: Console | None = None, start_step: int = 0, versus: bool = False):
        self.title, self.total_steps, self.log_seconds = title, total_steps, log_seconds
        self.versus = versus  # a two-player zero-sum game: the headline is the score against a random opponent
        self.start = time.perf_counter()
        self.start_step = self.step = start_step
        self.last: dict = {}
        self.notice: str | None = None  # a line shown under the bar (a stop request)
        self.last_log, self.logged_step = self.start, None
        self.console = console or Console()
        self.writer = _tensorboard_writer(tensorboard) if tensorboard else None
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                                 MofNCompleteColumn(), TextColumn("[cyan]{task.fields[sps]} steps/s mean"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=self.console)
        self.task = self.progress.add_task("steps", total=total_steps, completed=start_step, sps="-")
        self.live = Live(_View(self), console=self.console, refresh_per_second=4) if live else None

    def __enter__(self) -> "Dashboard":
        if self.live is not None:
            self.live.__enter__()
        else:
            self.console.print(f"{self.title}: {self.total_steps:,} agent steps"
                               + (f", from {self.start_step:,}" if self.start_step else "")
                               + f"; a progress line every {self.log_seconds:g} s", highlight=False, soft_wrap=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
        elif self.last and self.logged_step != self.step:
            self._log_line()
        if self.writer is not None:
            self.writer.close()

    def update(self, stats: dict) -> None:
        if "episode_return" in stats or not self.last:
            kept = {k: v for k, v in self.last.items() if k.startswith(MATCHES)}  # measured every few iterations
            self.last = {**kept, **stats}
        else:  # keep the last episode figures when no episode ended this iteration
            self.last.update(stats)
        self.step = stats["global_step"]
        self.progress.update(self.task, completed=min(self.step, self.total_steps), sps=f"{self.steps_per_second():,.0f}")
        if self.writer is not None:
            for key, value in stats.items():
                if isinstance(value, (int, float)) and (key in LOGGED or key.startswith((PER_AGENT, *MATCHES))):
                    self.writer.add_scalar(f"train/{key}", value, stats["global_step"])
        if self.live is None and time.perf_counter() - self.last_log >= self.log_seconds:
            self._log_line()

    def steps_per_second(self) -> float:
        """Mean rate of this session (a resumed run counts from where it resumed)."""
        elapsed = time.perf_counter() - self.start
        return (self.step - self.start_step) / elapsed if elapsed > 0 else 0.0

    def eta_seconds(self) -> float | None:
        rate = self.steps_per_second()
        return max(self.total_steps - self.step, 0) / rate if rate > 0 else None

    def _log_line(self) -> None:
        self.last_log, self.logged_step = time.perf_counter(), self.step
        eta = self.eta_seconds()
        shown = ", ".join(f"{label} {fmt.format(v)}" for k, label, fmt in SHOWN[1:5]
                          if isinstance(v := self.last.get(k), (int, float)))
        extra = ", ".join(f"{k} {v:.3f}" for k, v in self.last.items()
                          if k.startswith(PER_AGENT) and isinstance(v, (int, float)))
        matches = "; ".join(f"vs {who} win/draw/loss {_score(self.last, prefix).replace(' ', '')}, reward per game "
                            f"{_reward(self.last, prefix)}" for who, prefix in (("random", VERSUS), ("previous", PREVIOUS))
                            if isinstance(self.last.get(prefix + "win"), (int, float)))
        shown = "; ".join(part for part in (matches, shown) if part)  # a zero-sum game's score leads
        # a run stops at the first iteration boundary at or past the total: the step may pass it, the percentage not
        percent = min(100.0, 100.0 * self.step / self.total_steps) if self.total_steps else 100.0
        self.console.print(
            f"[{self.step:>12,}/{self.total_steps:,} {percent:5.1f}%] {self.steps_per_second():,.0f} steps/s mean, "
            f"elapsed {_clock(time.perf_counter() - self.start)}, ETA {_clock(eta) if eta is not None else '-'}"
            + (f" | {shown}" if shown else "") + (f", {extra}" if extra else ""),
            highlight=False, soft_wrap=True)

    def table(self) -> Table:
        """The latest figures, in columns of fixed width (the table does not jump as rows come and go). In a
        two-player zero-sum game the score against a random opponent heads the figures, shown from the first
        frame ("-" until measured) and kept between measurements; the mean self-play return is 0 by
        construction and labelled so."""
        stats = self.last
        table = Table(title=self.title, show_header=False, min_width=56)
        table.add_column(style="cyan", min_width=LABEL_WIDTH)
        table.add_column(justify="right", min_width=VALUE_WIDTH)
        rows = [(label, fmt.format(stats[key]) if isinstance(stats.get(key), (int, float)) else "-")
                for key, label, fmt in SHOWN]
        rows += [(f"return of {k[len(PER_AGENT):]}", f"{v:.3f}") for k, v in stats.items() if k.startswith(PER_AGENT)]
        if isinstance(stats.get("env_restarts"), int):  # ray backend: lost env actors replaced
            rows.append(("ray actor restarts", f"{stats['env_restarts']:,}"))
        if self.versus or any(k.startswith(VERSUS) for k in stats):
            rows[1:1] = [(f"vs {who}: win / draw / loss", _score(stats, prefix)) for who, prefix in
                         (("random", VERSUS), ("previous", PREVIOUS))]
            rows[3:3] = [(f"vs {who}: reward per game", _reward(stats, prefix)) for who, prefix in
                         (("random", VERSUS), ("previous", PREVIOUS))]
            rows = [(SELF_PLAY_LABEL if label == "episode return" else label, value) for label, value in rows]
        for label, value in rows:
            table.add_row(label, value)
        return table


def _score(stats: dict, prefix: str) -> str:
    return " / ".join(f"{stats[prefix + k]:.2f}" if isinstance(stats.get(prefix + k), (int, float)) else "-"
                      for k in ("win", "draw", "loss"))


def _reward(stats: dict, prefix: str) -> str:
    mean, half = stats.get(prefix + "reward"), stats.get(prefix + "reward_ci95")
    return f"{mean:+.3f} ± {half:.3f}" if isinstance(mean, (int, float)) and isinstance(half, (int, float)) else "-"


class _View:
    """What the live display draws at each refresh: the progress bar above the latest figures."""

    def __init__(self, board: Dashboard):
        self.board = board

    def __rich__(self) -> Group:
        notice = [f"[bold yellow]{self.board.notice}[/bold yellow]"] if self.board.notice else []
        return Group(self.board.progress, *notice, self.board.table())


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def _tensorboard_writer(logdir: str) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise SystemExit("TensorBoard logging was asked for, but the tensorboard package is not installed: "
                         "pip install tensorboard") from None
    return SummaryWriter(logdir)
