"""argparse types the subcommands share: a bad value becomes argparse's one-line usage error (exit 2)."""
from __future__ import annotations

import argparse
import math

SHORTCUTS = {  # flag -> the setting it sets (packrl.cli adds the flags; train reads which were given)
    "total_steps": "train.total_steps", "seed": "train.seed", "device": "train.device",
    "num_envs": "vec.num_envs", "backend": "vec.backend", "num_workers": "vec.num_workers",
    "network": "policy.network", "hidden": "policy.hidden",
}


EVAL_MODES = {"sampled": False, "greedy": True}
"""``packrl eval --mode``: each mode and whether its actions are deterministic."""
FIELD_CHARS = 400
"""``packrl inspect``: a field printed longer than this is cut (its length said) unless --full."""


def positive_int(text: str) -> int:
    return _bounded(text, int, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _bounded(text, int, 0, "0 or a positive integer")


def positive_float(text: str) -> float:
    value = _bounded(text, float, 0.0, "a positive number")
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    return _bounded(text, float, 0.0, "0 or a positive number")


def _bounded(text: str, kind: type, low: float, what: str):  # noqa: ANN202 - int or float, as kind
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not (math.isfinite(value) and value >= low):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def description(doc: str) -> str:
    """A command's ``--help`` description from its module docstring: the first paragraph as plain sentences
    (no RST ``literals``, lines joined), without a leading ``packrl CMD ARG:`` (the usage line shows it)."""
    text = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")
    command, colon, rest = text.partition(": ")
    if colon and command.startswith("packrl ") and rest:
        text = rest[0].upper() + rest[1:]
    return text if text.endswith(".") else text + "."
