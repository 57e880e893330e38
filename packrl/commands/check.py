"""``packrl check ENV``: check ENV with its policy (shapes, dtypes, ranges, NaNs and gradients) and print one report.

Exit status 0 when no check failed, 1 when one did (skipped checks are listed with their reason), 2 for a
bad flag or env id."""
from __future__ import annotations

import argparse

from packrl.commands.arguments import positive_int
from packrl.torch_threads import apply_torch_threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=positive_int, default=64, help="env steps to check (default 64)")


def run(args: argparse.Namespace, config: dict) -> int:
    return check_command(config, args.steps)


def check_command(config: dict, steps: int) -> int:
    """Check the env and policy ``config`` describes for ``steps`` steps and print the report; 0 or 1."""
    from packrl.check import check_config  # torch and the envs: seconds

    apply_torch_threads(None)  # one thread, as packrl train and eval
    return check_config(config, steps)
