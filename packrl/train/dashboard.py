"""A live terminal dashboard (rich) and optional TensorBoard logging, fed one stats dict per iteration."""
from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

SHOWN = (("sps", "steps/s", "{:,.0f}"), ("episode_return", "episode return", "{:.3f}"),
         ("episode_length", "episode length", "{:.1f}"), ("pg_loss", "policy loss", "{:.4f}"),
         ("v_loss", "value loss", "{:.4f}"), ("entropy", "entropy", "{:.4f}"), ("approx_kl", "approx KL", "{:.5f}"),
         ("clipfrac", "clip fraction", "{:.3f}"), ("explained_variance", "explained variance", "{:.3f}"),
         ("learning_rate", "learning rate", "{:.2e}"))


class Dashboard:
    """``with Dashboard(title, total_steps) as d: ppo.train(n, callback=d.update)``. ``live=False`` prints one
    line per ``every`` iterations instead (for logs and non-terminals)."""

    def __init__(self, title: str, total_steps: int, live: bool = True, tensorboard: str | None = None,
                 every: int = 10, console: Console | None = None):
        self.title, self.total_steps, self.every = title, total_steps, every
        self.console = console or Console()
        self.live = Live(self._table({}), console=self.console, refresh_per_second=4) if live else None
        self.writer = _tensorboard_writer(tensorboard) if tensorboard else None
        self.start = time.perf_counter()
        self.last: dict = {}

    def __enter__(self) -> "Dashboard":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
        if self.writer is not None:
            self.writer.close()

    def update(self, stats: dict) -> None:
        if "episode_return" in stats or not self.last:
            self.last = dict(stats)
        else:  # keep the last episode figures when no episode ended this iteration
            self.last.update({k: v for k, v in stats.items()})
        if self.writer is not None:
            for key, _, _ in SHOWN:
                if key in stats:
                    self.writer.add_scalar(f"train/{key}", stats[key], stats["global_step"])
        if self.live is not None:
            self.live.update(self._table(self.last))
        elif stats["iteration"] % self.every == 0:
            shown = ", ".join(f"{label} {fmt.format(self.last[k])}" for k, label, fmt in SHOWN[:5] if k in self.last)
            self.console.print(f"[{stats['global_step']:>10,}] {shown}")

    def _table(self, stats: dict) -> Table:
        elapsed = time.perf_counter() - self.start
        step = stats.get("global_step", 0)
        table = Table(title=f"{self.title}  {step:,}/{self.total_steps:,} steps  {elapsed:.0f} s", show_header=False,
                      min_width=48)
        table.add_column(style="cyan")
        table.add_column(justify="right")
        for key, label, fmt in SHOWN:
            table.add_row(label, fmt.format(stats[key]) if key in stats else "-")
        return table


def _tensorboard_writer(logdir: str) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise SystemExit("TensorBoard logging was asked for, but the tensorboard package is not installed: "
                         "pip install tensorboard") from None
    return SummaryWriter(logdir)
