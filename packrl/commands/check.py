"""``packrl check ENV``: check ENV with its policy (shapes, dtypes, ranges, NaNs and gradients) and print one report.

Exit status 0 when no check failed, 1 when one did (skipped checks are listed with their reason), 2 for a
bad flag or env id."""
from __future__ import annotations

import argparse

from packrl.commands.arguments import apply_torch_threads, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=positive_int, default=64, help="env steps to check (default 64)")


def run(args: argparse.Namespace, config: dict) -> int:
    return check_command(config, args.steps)


def check_command(config: dict, steps: int) -> int:
    from packrl.check import check_env, print_report
    from packrl.train.run import make_policy, make_vecenv

    apply_torch_threads(None)  # one thread, as packrl train and eval
    vecenv = make_vecenv(config, seed=int(config["train"].get("seed", 0)))
    try:
        report = check_env(vecenv, make_policy(vecenv, config["policy"]), steps=steps)
    finally:
        vecenv.close()
    print_report(report, title=f"packrl check {config['env']['id']}")
    return 0 if report.ok else 1
