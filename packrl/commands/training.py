"""The run behind ``packrl train`` (``packrl.commands.train`` checks the command line first, without torch): the
run options from the flags, torch's threads, the run (``packrl.train.session``) and its exit code."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from rich.console import Console

from packrl.errors import EXIT_BAD_INPUT, EXIT_STOPPED_BY_ERROR, PackrlError
from packrl.run_folders import error_line
from packrl.torch_threads import apply_torch_threads
from packrl.train.distributed import DivergedError, LostRankError
from packrl.train.session import RunOptions, train_run
from packrl.train.tracking import Tracking, TrackingError, require_wandb


def run(args: argparse.Namespace, config: dict, given: set[str]) -> int:
    """``packrl train``'s run: the W&B settings checked, the run options from the flags, the run, its exit code
    (one line on stderr for an error)."""
    try:
        track = _tracking(args)
    except PackrlError as err:
        print(f"packrl train: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    options = RunOptions(
        out=args.out, name=args.name, runs_dir=args.runs_dir, overwrite=args.overwrite, resume=args.resume,
        env_given=getattr(args, "env", None) is not None, total_steps_given="train.total_steps" in given,
        device_given="train.device" in given,
        checkpoint_every=args.checkpoint_every, checkpoint_minutes=args.checkpoint_minutes or None, keep=args.keep,
        live=not args.no_live, tensorboard=args.tensorboard, track=track, log_seconds=args.log_seconds,
        versus_every=args.versus_every, versus_games=args.versus_games, preamble=getattr(args, "preamble", None),
        max_policy_bytes=int(args.max_policy_gib * (1 << 30)), collective_timeout=args.collective_timeout)
    set_torch_threads(args.torch_threads)
    try:  # results on stdout; the lines that say why training stopped (an error, a signal) on stderr
        return train_run(config, options, Console(), errors=Console(stderr=True)).code
    except PackrlError as err:
        if not getattr(err, "quiet", False):  # a quiet error: rank 0 printed it
            print(f"packrl train: {error_line(err)}", file=sys.stderr)
        # a rank lost, or ranks whose weights differ: a run that failed, not a bad setting
        return EXIT_STOPPED_BY_ERROR if isinstance(err, (LostRankError, DivergedError)) else EXIT_BAD_INPUT


def _tracking(args: argparse.Namespace) -> object:
    """The W&B settings of --track (checked, and wandb importable), or None without it."""
    if not args.track:
        named = [flag for flag, value in (("--wandb-project", args.wandb_project), ("--wandb-entity", args.wandb_entity))
                 if value is not None]
        if named:
            raise TrackingError(f"{named[0]} applies with --track (add --track to log to W&B)")
        return None
    tracking = Tracking(project="packrl" if args.wandb_project is None else args.wandb_project, entity=args.wandb_entity)
    require_wandb()
    return tracking


def set_torch_threads(threads: int | None) -> int:
    """Set the intra-op threads as ``packrl train`` does; returns the number there was before."""
    before = torch.get_num_threads()
    apply_torch_threads(threads)
    return before


def train_command(config: dict, out: str | Path | None = None, live: bool = True, tensorboard: str | None = None,
                  torch_threads: int | None = None, **options: object) -> int:
    """``packrl.commands.train.train_command``."""
    before = set_torch_threads(torch_threads)
    try:
        return train_run(config, RunOptions(out=None if out is None else str(out), live=live, tensorboard=tensorboard,
                                            **options)).code
    finally:
        torch.set_num_threads(before)
