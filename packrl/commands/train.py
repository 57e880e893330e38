"""``packrl train ENV``: train PPO on ENV in a run folder of its own, with live progress, periodic checkpoints,
a checkpoint saved on SIGINT or SIGTERM, a NaN guard and ``--resume``.

The run itself is ``packrl.train.session``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from packrl.commands.arguments import (
    SHORTCUTS,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from packrl.errors import EXIT_BAD_INPUT
from packrl.printing import shown


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


def run(args: argparse.Namespace, config: dict) -> int:
    """The command once its settings are checked: a resume that would change a recorded setting is refused here,
    before torch; the run itself is ``packrl.commands.training``."""
    given = _given_settings(args)
    if args.resume is not None:
        fixed = sorted(given - RESUME_CHANGEABLE)
        fixed += ["--config"] if getattr(args, "config", None) else []
        fixed += ["--preset"] if getattr(args, "preset", "auto") != "auto" else []
        if fixed:
            print(f"packrl train: --resume continues the run with its recorded settings, which {', '.join(fixed)} "
                  "would change (a resumed run may change only ENV, --total-steps and --device)", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not Path(args.resume).exists():  # before torch: a mistyped path is refused at once
            print(shown(f"packrl train: --resume {args.resume}: no such run or checkpoint folder"), file=sys.stderr)
            return EXIT_BAD_INPUT
    from packrl.commands import training  # torch, the envs and the trainer: seconds

    return training.run(args, config, given)


def train_command(config: dict, out: str | Path | None = None, live: bool = True, tensorboard: str | None = None,
                  torch_threads: int | None = None, **options: object) -> int:
    """Train as ``packrl train`` does, from Python; returns its exit code. ``options``: other RunOptions.
    Like the command, it trains on one torch intra-op thread unless ``torch_threads`` or OMP_NUM_THREADS says
    otherwise (1.3-1.6x faster than torch's default on a busy 2-core machine), and gives the caller's number
    of threads back afterwards."""
    from packrl.commands import training

    return training.train_command(config, out, live, tensorboard, torch_threads, **options)
