"""Other libraries' output that packrl knows to be noise, kept off the user's terminal.

BabyAI levels draw their missions by rejection sampling and ``print`` every rejection (``Sampling rejected:
unreachable object``, ``Timeout during mission generation: ...``): 43 of the 54 stdout lines of a 10k-step
BabyAI run. ``quiet_known_prints`` drops those lines from the env's reset; anything else the env prints passes.
"""
from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import Any

import gymnasium

KNOWN_PRINTS = {"BabyAI-": ("Sampling rejected:", "Timeout during mission generation:")}
"""Env id prefix -> the starts of the lines its envs print that packrl drops (minigrid's babyai/roomgrid_level.py)."""


class DropPrintedLines(gymnasium.Wrapper):
    """The env as it is, except that lines its ``reset`` prints starting with one of ``prefixes`` are dropped."""

    def __init__(self, env: gymnasium.Env, prefixes: tuple[str, ...]):
        super().__init__(env)
        self.prefixes = prefixes

    def reset(self, **kwargs: Any) -> Any:
        with dropped_lines(self.prefixes):
            return self.env.reset(**kwargs)


@contextlib.contextmanager
def dropped_lines(prefixes: tuple[str, ...]) -> Iterator[None]:
    """What is printed to stdout inside, less the lines that start with one of ``prefixes``."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        kept = [line for line in buffer.getvalue().splitlines(keepends=True) if not line.startswith(prefixes)]
        if kept:
            sys.stdout.write("".join(kept))


def quiet_known_prints(env_id: str, env: gymnasium.Env) -> gymnasium.Env:
    """``env``, wrapped to drop the lines KNOWN_PRINTS names for ``env_id`` (any ``module:`` prefix aside)."""
    name = env_id.rpartition(":")[2]
    prefixes = next((lines for start, lines in KNOWN_PRINTS.items() if name.startswith(start)), None)
    return env if prefixes is None else DropPrintedLines(env, prefixes)
