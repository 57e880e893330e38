"""``packrl train ENV``: train PPO on ENV in a run folder of its own, with live progress, periodic checkpoints,
a checkpoint saved on SIGINT or SIGTERM, a NaN guard and ``--resume``.

The run itself is ``packrl.train.session``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from packrl.commands.arguments import (
    SHORTCUTS,
    apply_torch_threads,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from packrl.errors import PackrlError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run folder, checkpoints and progress")
    run.add_argument("--name", help="run folder runs/NAME (default: runs/<env>-<date>-<time>)")
    run.add_argument("--out", metavar="DIR", help="run folder DIR exactly (instead of --name)")
    run.add_argument("--runs-dir", default="runs", metavar="DIR", help="where named and timestamped runs go (default runs)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run folder of that name")
    run.add_argument("--resume", metavar="RUN_OR_CHECKPOINT",
                     help="continue a run (its folder, or one of its checkpoints) where its checkpoint left it")
    run.add_argument("--max-policy-gib", type=positive_float, default=2.0, metavar="GIB",
                     help="with --resume: refuse a checkpoint whose policy would take more than this (default 2; "
                          "a policy may also take at most 4x its weights file)")
    run.add_argument("--checkpoint-every", type=positive_int, metavar="STEPS",
                     help="save a periodic checkpoint every STEPS agent steps")
    run.add_argument("--checkpoint-minutes", type=non_negative_float, default=10.0, metavar="MIN",
                     help="save a periodic checkpoint every MIN minutes (default 10; 0: never)")
    run.add_argument("--keep", type=positive_int, default=3, metavar="K",
                     help="periodic checkpoints kept (the newest K; default 3)")
    run.add_argument("--tensorboard", metavar="LOGDIR", nargs="?", const="",
                     help="also log to TensorBoard (needs the tensorboard package), into a fresh subfolder: "
                          "LOGDIR/<run folder name>, or RUN/tensorboard when LOGDIR is left out")
    run.add_argument("--track", action="store_true",
                     help="also log to Weights & Biases (needs wandb: pip install 'packrl[wandb]'), into RUN/wandb; "
                          "offline unless WANDB_MODE says otherwise or you are logged in and W&B answers")
    run.add_argument("--wandb-project", metavar="NAME", help="with --track: the W&B project (default packrl)")
    run.add_argument("--wandb-entity", metavar="NAME", help="with --track: the W&B user or team (default: yours)")
    run.add_argument("--no-live", action="store_true", help="progress lines instead of the live view")
    run.add_argument("--log-seconds", type=positive_float, default=5.0, metavar="S",
                     help="seconds between progress lines without the live view (default 5)")
    run.add_argument("--versus-every", type=non_negative_int, default=10, metavar="ITERS",
                     help="two-player zero-sum games: win/draw/loss against a random opponent every ITERS "
                          "iterations (default 10; 0: never)")
    run.add_argument("--versus-games", type=positive_int, default=20, metavar="N", help="games per check (default 20)")
    run.add_argument("--collective-timeout", type=positive_float, default=60.0, metavar="S",
                     help="under torchrun: seconds a rank waits for the others in a collective before it stops with "
                          "an error naming the lost rank (default 60)")
    run.add_argument("--torch-threads", type=positive_int, metavar="N",
                     help="torch intra-op threads on CPU (default 1, or OMP_NUM_THREADS when set: a small policy "
                          "gains little from more, and loses several-fold when another process holds a core)")


def run(args: argparse.Namespace, config: dict) -> int:
    from rich.console import Console

    from packrl.train.session import EXIT_BAD_INPUT, RunOptions, train_run

    given = _given_settings(args)
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
    if args.resume is not None:
        fixed = sorted(given - RESUME_CHANGEABLE)
        fixed += ["--config"] if getattr(args, "config", None) else []
        fixed += ["--preset"] if getattr(args, "preset", "auto") != "auto" else []
        if fixed:
            print(f"packrl train: --resume continues the run with its recorded settings, which {', '.join(fixed)} "
                  "would change (a resumed run may change only ENV, --total-steps and --device)", file=sys.stderr)
            return EXIT_BAD_INPUT
    _set_torch_threads(args.torch_threads)
    try:  # results on stdout; the lines that say why training stopped (an error, a signal) on stderr
        return train_run(config, options, Console(), errors=Console(stderr=True)).code
    except PackrlError as err:
        from packrl.run_folders import error_line
        from packrl.train.distributed import DivergedError, LostRankError
        from packrl.train.session import EXIT_STOPPED_BY_ERROR

        if not getattr(err, "quiet", False):  # a quiet error: rank 0 printed it
            print(f"packrl train: {error_line(err)}", file=sys.stderr)
        # a rank lost, or ranks whose weights differ: a run that failed, not a bad setting
        return EXIT_STOPPED_BY_ERROR if isinstance(err, (LostRankError, DivergedError)) else EXIT_BAD_INPUT


def _tracking(args: argparse.Namespace) -> object:
    """The W&B settings of --track (checked, and wandb importable), or None without it."""
    from packrl.train.tracking import Tracking, TrackingError, require_wandb

    if not args.track:
        named = [flag for flag, value in (("--wandb-project", args.wandb_project), ("--wandb-entity", args.wandb_entity))
                 if value is not None]
        if named:
            raise TrackingError(f"{named[0]} applies with --track (add --track to log to W&B)")
        return None
    tracking = Tracking(project="packrl" if args.wandb_project is None else args.wandb_project, entity=args.wandb_entity)
    require_wandb()
    return tracking


def _set_torch_threads(threads: int | None) -> int:
    """Set the intra-op threads as ``packrl train`` does; returns the number there was before."""
    import torch

    before = torch.get_num_threads()
    apply_torch_threads(threads)
    return before


RESUME_CHANGEABLE = {"train.total_steps", "train.device"}
"""The settings a resumed run may change (every other one is the recorded run's)."""


def _given_settings(args: argparse.Namespace) -> set[str]:
    """The settings (``section.key``) given on the command line, by their own flag or a shortcut."""
    given = set()
    for dest, value in vars(args).items():
        if value is not None and dest.startswith("cfg:"):
            given.add(dest[4:])
        elif value is not None and dest.startswith("short:"):
            given.add(SHORTCUTS.get(dest[6:], dest[6:]))
    return given


def train_command(config: dict, out: str | Path | None = None, live: bool = True, tensorboard: str | None = None,
                  torch_threads: int | None = None, **options: object) -> int:
    """Train as ``packrl train`` does, from Python; returns its exit code. ``options``: other RunOptions.
    Like the command, it trains on one torch intra-op thread unless ``torch_threads`` or OMP_NUM_THREADS says
    otherwise (1.3-1.6x faster than torch's default on a busy 2-core machine), and gives the caller's number
    of threads back afterwards."""
    import torch

    from packrl.train.session import RunOptions, train_run

    before = _set_torch_threads(torch_threads)
    try:
        return train_run(config, RunOptions(out=None if out is None else str(out), live=live, tensorboard=tensorboard,
                                            **options)).code
    finally:
        torch.set_num_threads(before)

