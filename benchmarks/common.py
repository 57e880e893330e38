"""Shared benchmark helpers: the machine line, medians over repeats, a rich table."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
from gymnasium import spaces
from rich.console import Console
from rich.table import Table

NETHACK = spaces.Dict({  # a NetHack-like observation: ten leaves of mixed dtypes, 10,912 bytes packed
    "glyphs": spaces.Box(0, 5976, (21, 79), np.int16),
    "chars": spaces.Box(0, 255, (21, 79), np.uint8),
    "colors": spaces.Box(0, 15, (21, 79), np.uint8),
    "specials": spaces.Box(0, 255, (21, 79), np.uint8),
    "blstats": spaces.Box(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (27,), np.int64),
    "message": spaces.Box(0, 255, (256,), np.uint8),
    "inv_glyphs": spaces.Box(0, 5976, (55,), np.int16),
    "inv_letters": spaces.Box(0, 127, (55,), np.uint8),
    "inv_oclasses": spaces.Box(0, 18, (55,), np.uint8),
    "tty_chars": spaces.Box(0, 255, (24, 80), np.uint8),
})

SHARED_TOOLS = Path(__file__).resolve().parents[2] / "shared" / "tools"


def machine_line(extra: tuple[str, ...] = ()) -> str:
    """The shared tools' machine line when present (it is in CI and on the team's machines), else our own."""
    packages = ("packrl", "numpy", "torch", "gymnasium", "pettingzoo", "numba") + tuple(extra)
    if (SHARED_TOOLS / "machine_line.py").exists():
        sys.path.insert(0, str(SHARED_TOOLS))
        from machine_line import machine_line as shared

        return shared(packages)
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cpus ({platform.machine()}), load {load:.2f}, Python {platform.python_version()}, " + ", ".join(versions)


def calls_per_batch(fn: Callable[[], object], min_time: float = 0.05) -> int:
    """The smallest power of two of calls to ``fn`` that takes at least ``min_time`` seconds."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start >= min_time:
            return n
        n *= 2


def per_call_us(fn: Callable[[], object], repeats: int = 7, min_time: float = 0.05) -> tuple[float, float]:
    """Median and spread (max-min) in microseconds per call, over ``repeats`` timed batches."""
    n = calls_per_batch(fn, min_time)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples), max(samples) - min(samples)


def us_per_step(makers: dict, n: int, seconds: float, repeats: int,
                step_of: Callable[[str, object], Callable] | None = None) -> dict[str, list[float]]:
    """us per vector step of each env (``makers``: name -> a vector env of ``n`` envs with two actions), measured
    in turn within each repeat (so a change of load hits all alike), after a 50-step warm-up from ``reset(seed=0)``.
    ``step_of(name, env)`` is the step to time (default: ``env.step``)."""
    envs = {name: make() for name, make in makers.items()}
    steps_of = {name: step_of(name, env) if step_of else env.step for name, env in envs.items()}
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, n) for _ in range(64)]
    for name, env in envs.items():
        env.reset(seed=0)
        for k in range(50):
            steps_of[name](actions[k % 64])
    samples: dict[str, list[float]] = {name: [] for name in envs}
    for _ in range(repeats):
        for name, step in steps_of.items():
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                for _ in range(16):
                    step(actions[steps % 64])
                    steps += 1
            samples[name].append((time.perf_counter() - start) / steps * 1e6)
    for env in envs.values():
        env.close()
    return samples


def print_table(title: str, columns: list[str], rows: list[list[object]]) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right" if col != columns[0] else "left")
    for row in rows:
        table.add_row(*[f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row])
    Console(width=160).print(table)


def summary(values: list) -> str:
    """``median [min-max]`` of the values that are not None, with ``(k/n)`` when some are (a run that missed)."""
    found = [v for v in values if v is not None]
    if not found:
        return "none"
    fmt = (lambda v: f"{v:,.0f}") if max(found) >= 100 else (lambda v: f"{v:.2f}")
    share = f" ({len(found)}/{len(values)})" if len(found) < len(values) else ""
    return f"{fmt(statistics.median(found))} [{fmt(min(found))}-{fmt(max(found))}]{share}"


def record_returns(ppo, record: Callable[[list[float]], object]) -> None:
    """Give ``record`` the returns of the episodes that finished in each iteration (a list per iteration), by
    swapping ``ppo.episodes`` for an EpisodeTracker that reports them before PPO pops its statistics."""
    from packrl.train.ppo import EpisodeTracker

    class Recording(EpisodeTracker):
        def pop(self) -> dict:
            record([r for r, _, _ in self.finished])
            return super().pop()

    ppo.episodes = Recording(ppo.num_rows, ppo.episodes.agents)


def setting_changes(items: list[str]) -> dict:
    """``--set section.key=value`` items as ``{section: {key: value}}`` (values parsed as the CLI parses them)."""
    from packrl.train.run import parse_value

    changes: dict = {}
    for item in items:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        changes.setdefault(section, {})[name] = parse_value(value)
    return changes
