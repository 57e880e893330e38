"""Search a packrl env's training settings with Optuna: each trial is an ordinary packrl run folder, and
``packrl sweep show SWEEP`` (best trials, Pareto front, PNG plots, best.toml) and ``packrl sweep dashboard SWEEP``
(optuna-dashboard on localhost) read the study.

The reference is docs/sweep.md (``packrl.sweep``). Exit status: 0 done, 2 bad input (one line on stderr), 130/143
stopped by SIGINT/SIGTERM (rerun to continue)."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from packrl import config as config_settings
from packrl.commands.arguments import description, non_negative_int, positive_int
from packrl.env_ids import env_creator
from packrl.errors import PackrlError
from packrl.run_folders import error_line, printable
from packrl.sweep.objective import parse_objective
from packrl.sweep.options import PRUNERS, SAMPLERS, SweepError, SweepOptions
from packrl.sweep.space import load_space
from packrl.sweep.storage import masked, open_storage, password, scrub, sqlite_url

if TYPE_CHECKING:
    from rich.console import Console

SUBCOMMANDS = ("show", "dashboard")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")  # one line, exit 2


def sweep_parser() -> _Parser:
    parser = _Parser(prog="packrl sweep", description=description(__doc__), allow_abbrev=False,
                     epilog="packrl sweep show SWEEP: results and plots; packrl sweep dashboard SWEEP: optuna-dashboard")
    parser.add_argument("env", metavar="ENV", help="the env id, as packrl train takes it")
    parser.add_argument("--trials", type=positive_int, default=20, metavar="N",
                        help="finished trials the study should hold, counted over every sweep sharing it (default 20)")
    parser.add_argument("--budget", type=positive_int, default=50_000, metavar="STEPS",
                        help="agent steps per trial (default 50000)")
    parser.add_argument("--jobs", type=positive_int, default=1, metavar="K",
                        help="trials run at once, each a process with one torch thread (default 1)")
    parser.add_argument("--space", metavar="FILE", help="TOML space file narrowing, widening or fixing the settings' "
                        "default ranges (docs/sweep.md)")
    parser.add_argument("--storage", metavar="URL", help="the study's database (default: SQLite in the sweep folder; "
                        "postgresql://user:password@host/db lets sweeps on several machines share one study)")
    parser.add_argument("--study", metavar="NAME", help="the study's name (default: the env id)")
    parser.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="Optuna sampler (default tpe)")
    parser.add_argument("--pruner", choices=PRUNERS, default="median", help="Optuna pruner (default median)")
    parser.add_argument("--objective", default="return", metavar="return|steps-to:THRESHOLD",
                        help="maximize the mean return at the budget (default), or minimize the agent steps to reach "
                             "a mean return of THRESHOLD, capped at the budget")
    parser.add_argument("--seed", type=non_negative_int, default=0, metavar="S",
                        help="fixes the sampler and every trial's seed (default 0)")
    parser.add_argument("--out", metavar="DIR", help="the sweep folder (default sweeps/<study>)")
    parser.add_argument("--preset", default="auto", metavar="NAME",
                        help="the preset under the searched settings, as in packrl train (default auto)")
    parser.add_argument("--no-live", action="store_true", help="log lines instead of the live table")
    return parser


def show_parser(name: str) -> _Parser:
    parser = _Parser(prog=f"packrl sweep {name}", allow_abbrev=False)
    parser.add_argument("sweep", metavar="SWEEP", help="a sweep folder (it holds sweep.json)")
    parser.add_argument("--storage", metavar="URL", help="the study's database, when it is not the sweep's SQLite file "
                        "(a password is never recorded in the sweep folder)")
    if name == "dashboard":
        parser.add_argument("--port", type=positive_int, default=8080, help="port on 127.0.0.1 (default 8080)")
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    else:
        parser.add_argument("--no-plots", action="store_true", help="tables and best.toml only, no PNG")
    return parser


def main(argv: list[str]) -> int:
    try:
        import optuna  # noqa: F401 - imported only to learn whether the sweep extra is installed
    except ImportError:
        return _fail("needs Optuna, which is not installed: pip install 'packrl[sweep]'")
    if argv[:1] and argv[0] in SUBCOMMANDS:
        args = show_parser(argv[0]).parse_args(argv[1:])
        return _results(argv[0], args)
    args = sweep_parser().parse_args(argv)
    return _sweep(args)


def _fail(message: str) -> int:
    print(printable(f"packrl sweep: {message}"), file=sys.stderr)
    return 2


def _sweep(args: argparse.Namespace) -> int:
    try:
        options = sweep_options(args)
        from packrl.sweep.study import run_sweep

        return run_sweep(options, _console())
    except PackrlError as err:
        return _fail(scrub(error_line(err), args.storage) if args.storage else error_line(err))


def _console() -> Console:
    """The terminal's width on a terminal; piped into a log, 200 columns, so a table of parameters is not cut."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def sweep_options(args: argparse.Namespace) -> object:
    """The checked options of a sweep command line; PackrlError (one line) for bad input."""
    objective = parse_objective(args.objective, args.budget)
    space = load_space(args.space)
    study = args.study or re.sub(r"[^A-Za-z0-9_.-]+", "-", args.env).strip("-.") or "sweep"
    layer = {section: dict(values) for section, values in space.fixed.items()}
    layer.setdefault("env", {})["id"] = args.env
    layer.setdefault("train", {})["total_steps"] = args.budget
    base, _ = config_settings.resolve(None, config_settings.ConfigLayer(layer, args.space or "command line"),
                                      args.preset)
    env_creator(base["env"]["id"], base["env"]["kwargs"], base["env"]["api"])
    num_steps = [d for d in space.dimensions if d.key == "train.num_steps"]
    largest = max(num_steps[0].choices or (num_steps[0].high,)) if num_steps else \
        base["train"].get("num_steps", config_settings.settings()["train.num_steps"].default)
    iteration = int(largest) * int(base["vec"]["num_envs"])
    if args.budget < iteration:
        raise SweepError(f"--budget {args.budget:,} is smaller than one iteration: vec.num_envs {base['vec']['num_envs']} "
                         f"x train.num_steps up to {int(largest)} = {iteration:,} agent steps")
    if args.storage is not None:
        if "://" not in args.storage:
            raise SweepError(f"--storage {masked(args.storage)}: expected a database URL "
                             "(postgresql://user:password@host/db, sqlite:///path)")
        open_storage(args.storage)  # answers within CONNECT_SECONDS, or one line
    return SweepOptions(env=args.env, trials=args.trials, budget=args.budget, jobs=args.jobs, space=space,
                        storage=args.storage, study=study, sampler=args.sampler, pruner=args.pruner,
                        objective=objective, seed=args.seed, out=args.out, live=not args.no_live, base=base)


def _results(name: str, args: argparse.Namespace) -> int:
    """``show`` or ``dashboard`` of a sweep folder."""
    folder = Path(args.sweep)
    try:
        record = json.loads((folder / "sweep.json").read_text())
    except (OSError, ValueError):
        return _fail(f"{folder}: no sweep.json in it (give a folder that packrl sweep wrote)")
    url = args.storage or (sqlite_url(folder) if record.get("storage_is_default") else record.get("storage", ""))
    if args.storage is None and not record.get("storage_is_default"):
        if password(url) == "***":
            return _fail(f"{folder}: its study is in {url}; give --storage with the password")
    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = open_storage(url)
        study = optuna.load_study(study_name=record["study"], storage=storage)
        if name == "dashboard":
            from packrl.sweep.dashboard import serve

            return serve(storage, args.host, args.port, record["study"])
        from packrl.sweep.show import show

        for path in show(study, folder, _console(), plots=not args.no_plots):
            print(f"plot: {path}")
        return 0
    except KeyError:
        return _fail(f"{folder}: study {record.get('study')!r} is not in {masked(url)}")
    except PackrlError as err:
        return _fail(scrub(error_line(err), url))
