"""One training run as a person runs it: its own folder, periodic checkpoints, signals that save, a NaN
guard, and resuming.

    runs/<name>/                 --name NAME, --out DIR, or <env>-<date>-<time> (never reused unless asked)
      checkpoint/                the newest complete checkpoint (periodic, or the last one of the run)
      checkpoints/step-<N>/      periodic checkpoints, the newest ``keep`` of them
      history.jsonl              one line per iteration, written as it happens (NaN kept as "nan")
      learning_curve.png

Exit codes: 0 done, 130 stopped by SIGINT (Ctrl-C), 143 stopped by SIGTERM (both save a checkpoint at the
end of the iteration under way, then exit), 3 stopped by an error once training was under way (a non-finite
value, an env error, a checkpoint that could not be written: nothing of that iteration is saved, the last
good checkpoint stays), 2 a bad setting, folder or checkpoint to resume.

``--resume RUN_OR_CHECKPOINT`` continues from a checkpoint, at the iteration boundary it was saved at: the
weights, the optimizer state, the step and iteration counts (so the learning-rate schedule), and the torch,
NumPy and Python RNG states are restored exactly; every env is reset with seeds derived from (seed,
iteration) (``PPO.reset_envs``), so episodes under way at the cut restart. History and curve continue in the
same run folder.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from packrl import config as config_settings
from packrl.checkpoint import CheckpointError, load_checkpoint, read_metadata, verify
from packrl.errors import (  # noqa: F401 - the exit codes re-exported: callers read them here
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_STOPPED_BY_ERROR,
    ConfigError,
    PackrlError,
)
from packrl.history import History, history_line, read_history  # noqa: F401 - re-exported
from packrl.printing import shell_word
from packrl.run_folders import (
    MARKER,
    RunError,
    check_name,
    create_run_folder,
    find_checkpoint,  # noqa: F401 - re-exported (tests and callers import it from here)
    fresh_subfolder,
    inside,
    mark,
    newest_checkpoint,
    printable,
    remove_run_folder,
)
from packrl.run_folders import error_line as one_line
from packrl.train.checkpoint_env import checked_config, checked_distributed, is_data_env_id
from packrl.train.dashboard import Dashboard
from packrl.train.distributed import DivergedError, env_seed, join, launched_by_torchrun, rank_seed
from packrl.train.plot import curve_line, plot_learning_curve
from packrl.train.ppo import PPO, NonFiniteError, seed_everything
from packrl.train.run import check_fits, env_creator, make_policy, make_vecenv, ppo_config, save
from packrl.train.tracking import start as start_tracker
from packrl.train.versus import closing_lines, game_creator, is_two_player_zero_sum, training_check

if TYPE_CHECKING:  # annotations only: the run imports torch when it starts, not when this module is read
    from packrl.train.distributed import Group

RUN_WRITES = ("history.jsonl", "learning_curve.png", "checkpoint", "checkpoints", "tensorboard", "wandb")
"""What a run writes into its folder (each through ``run_folders.write_file`` or the checkpoint writer)."""
SIGNAL_EXIT = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}


@dataclass
class RunOptions:
    """Where a run goes and how it is watched; the training settings themselves are the config."""

    out: str | None = None  # exactly this folder
    name: str | None = None  # runs_dir/NAME
    runs_dir: str = "runs"
    overwrite: bool = False
    resume: str | None = None  # a run folder or a checkpoint folder
    env_given: bool = False  # the env id was given on the command line (not read from the checkpoint)
    total_steps_given: bool = False  # with resume: the given total_steps replaces the recorded one
    device_given: bool = False  # with resume: the given device replaces the recorded one
    checkpoint_every: int | None = None  # agent steps between periodic checkpoints
    checkpoint_minutes: float | None = 10.0
    keep: int = 3
    live: bool = True
    tensorboard: str | None = None
    track: Any = None  # a packrl.train.tracking.Tracking: also log to Weights & Biases (--track)
    log_seconds: float = 5.0
    versus_every: int = 10  # iterations between win-rate checks (two-player zero-sum games; 0: never)
    versus_games: int = 20
    preamble: str | None = None  # a line printed once the run is set up (the CLI's preset line)
    max_policy_bytes: int = 2 << 30  # with resume: the largest policy a checkpoint may rebuild
    collective_timeout: float = 60.0  # under torchrun: seconds a collective waits for the other ranks


@dataclass
class RunResult:
    code: int
    folder: Path | None
    checkpoint: Path | None
    global_step: int
    last_return: float | None


# ---------------------------------------------------------------- folders


def new_run_folder(options: RunOptions, env_id: str) -> Path:
    """The folder of a new run, made and marked (``run_folders.MARKER``): ``out``, ``runs_dir/name`` (``name``
    one folder name), or ``runs_dir/<env>-<timestamp>``. An existing folder that is not empty is refused
    unless ``overwrite``, and then deleted only if it is a packrl run (``run_folders.remove_run_folder``)."""
    if options.out is not None and options.name is not None:
        raise RunError("--out and --name both name the run folder: give one")
    if options.out is not None or options.name is not None:
        folder = Path(options.out) if options.out is not None else Path(options.runs_dir) / check_name(options.name)
        if folder.is_symlink():
            raise RunError(f"run folder {folder}: is a symlink; a run folder is never written through a symlink")
        if folder.exists() and (not folder.is_dir() or any(p.name != MARKER for p in folder.iterdir())):
            if not options.overwrite:
                raise RunError(f"run folder {folder} already exists; pass --overwrite to replace it, --resume {folder} "
                               "to continue it, or choose another --name/--out")
            remove_run_folder(folder)
        return create_run_folder(folder, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", env_id.rsplit(".", 1)[-1] if env_id.startswith("pettingzoo.") else env_id)
    stem = stem.strip("-.") or "run"
    base = Path(options.runs_dir) / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder, n = base, 1
    while True:
        try:
            folder.mkdir(parents=True)
            return create_run_folder(folder, exist_ok=True)
        except FileExistsError:
            n += 1
            folder = base.with_name(f"{base.name}-{n}")


# ---------------------------------------------------------------- checkpoints


class Checkpoints:
    """Saves ``checkpoint/`` and the periodic ``checkpoints/step-<N>/`` of a run, keeping the newest ``keep``
    periodic ones. An old checkpoint is removed only after the new one is completely written.

    In a data-parallel run (``group``) every rank calls the saves at the same iterations: the ranks first prove
    their weights bit-identical (``Group.check_identical``) and hand rank 0 their training states, then rank 0
    alone writes, recording ``distributed`` (world size, backend, per-rank seeds, weight digests, and each other
    rank's training state for ``--resume``) in the metadata."""

    def __init__(self, folder: Path, every_steps: int | None, every_minutes: float | None, keep: int, step: int,
                 group: Group):
        if keep < 1:
            raise RunError(f"--keep {keep}: keep at least 1 periodic checkpoint")
        if every_steps is not None and every_steps < 1:
            raise RunError(f"--checkpoint-every {every_steps}: give a positive number of agent steps")
        self.folder, self.every_steps, self.keep, self.group = folder, every_steps, keep, group
        self.writes = group.main
        self.every_seconds = every_minutes * 60.0 if every_minutes else None
        self.last_step, self.last_time = step, time.monotonic()
        self.latest: Path | None = None

    def due(self, step: int) -> bool:
        by_steps = self.every_steps is not None and step // self.every_steps > self.last_step // self.every_steps
        by_time = self.every_seconds is not None and time.monotonic() - self.last_time >= self.every_seconds
        return by_steps or by_time

    def save_periodic(self, ppo: Any, config: dict, history: list[dict]) -> Path:
        extra = self._ranks(ppo, config)
        path = self.folder / f"checkpoints/step-{ppo.global_step:012d}"
        if self.writes:
            path = save(ppo, config, inside(self.folder, f"checkpoints/step-{ppo.global_step:012d}"), history, extra)
        self._save_latest(ppo, config, history, extra)
        if self.writes:
            self._rotate(keep=path)
        return path

    def save_latest(self, ppo: Any, config: dict, history: list[dict]) -> Path:
        return self._save_latest(ppo, config, history, self._ranks(ppo, config))

    def _save_latest(self, ppo: Any, config: dict, history: list[dict], extra: dict | None) -> Path:
        self.latest = save(ppo, config, inside(self.folder, "checkpoint"), history, extra) if self.writes \
            else self.folder / "checkpoint"
        self.last_step, self.last_time = ppo.global_step, time.monotonic()
        return self.latest

    def _ranks(self, ppo: Any, config: dict) -> dict:
        """The group's checkpoint metadata (``Group.checkpoint_fields``: a data-parallel run's ``distributed``,
        nothing for one process)."""
        return self.group.checkpoint_fields(ppo, int(config["vec"]["num_envs"]))

    def _rotate(self, keep: Path) -> None:
        """Remove periodic checkpoints beyond the newest ``keep`` (by write time: after a resume from an
        earlier checkpoint, the abandoned later ones go first)."""
        saved = [p for p in (self.folder / "checkpoints").glob("step-*") if p.is_dir() and not p.is_symlink()]
        saved.sort(key=lambda p: (p == keep, _mtime(p)))
        for old in saved[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)


def _mtime(path: Path) -> float:
    try:
        return (path / "metadata.json").stat().st_mtime
    except OSError:
        return 0.0


# ---------------------------------------------------------------- signals


class StopSignals:
    """SIGINT and SIGTERM ask the run to stop at the end of the iteration under way (then it saves); a
    second SIGINT stops at once, without saving. Outside the main thread signals are left alone."""

    def __init__(self) -> None:
        self.received: int | None = None  # the signal that stops the run, as the ranks agreed (``_agree``)
        self.own: int | None = None  # the signal this process received (its vote at the next agreement)
        self.board: Any = None  # the Dashboard to tell (its live view shows the notice)
        self.quiet = False  # a rank other than 0: no notice
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNAL_EXIT:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if (self.own is not None or self.received is not None) and signum == signal.SIGINT:
            raise KeyboardInterrupt
        # Only ``own``: ``received`` is what the ranks agreed (``_agree``). A signal that lands after this rank's
        # vote has left must not stop this rank alone, or it would leave the loop while its peers go on and the
        # next collectives of the two would not match (gloo aborts on the size mismatch).
        self.own = signum
        notice = (f"{signal.Signals(signum).name}: stopping at the end of this iteration to save a checkpoint"
                  + (" (Ctrl-C again: stop now, without saving)" if signum == signal.SIGINT else ""))
        if self.quiet:
            return
        if self.board is not None and self.board.live is not None:
            self.board.notice = notice
        else:  # one small write, safe in a signal handler
            os.write(2, (notice + "\n").encode())


# ---------------------------------------------------------------- the run


@dataclass
class Resumed:
    """What ``--resume`` continues from: the run's config as recorded (``_resumed_config``), the checkpoint, its
    run folder (None: a checkpoint outside one), the checkpoint as verified (read and hashed once) and this
    rank's training state."""

    config: dict
    checkpoint: Path
    folder: Path | None
    verified: Any  # packrl.checkpoint.Verified
    state: dict

    @property
    def recorded_env(self) -> str:
        return self.verified.metadata["config"]["env"]["id"]

    def refusal(self, error: BaseException | str) -> RunError:
        """``error`` (a layout, architecture or backend that does not fit) as one ``--resume`` line that names
        the real mismatch first: an env other than the run's."""
        env = self.config["env"]["id"]
        differs = f"the env {env!r} differs from the run's {self.recorded_env!r}: " if env != self.recorded_env else ""
        return RunError(f"--resume {self.checkpoint}: {differs}{str(error).strip()}")


def train_run(config: dict, options: RunOptions, console: Console | None = None,
              errors: Console | None = None) -> RunResult:
    """Train one run as the options say. Errors in the settings, the folder or the checkpoint to resume
    raise (``PackrlError``: the caller prints them, exit 2); what happens once training started is
    told by the exit code of the result. The steps: what to resume, the run folder, the envs, the trainer,
    the training loop (``_train``), the closing report (``_report``). The lines that say why training stopped
    (an error, a signal) go to ``errors`` (the command's stderr; default: ``console``)."""
    group = join(options.collective_timeout)  # under torchrun: this process is one rank of the run
    main = group.main
    console = console or Console()
    if not main:  # ranks other than 0 print nothing but errors (on stderr, by the caller)
        console = Console(quiet=True)
    errors = console if errors is None or not main else errors
    try:
        resumed = _resume_from(options, config, console, group) if options.resume is not None else None
        config = resumed.config if resumed is not None else config
        folder = _run_folder(options, config, resumed, group)
        cfg = ppo_config(config)
        seed_everything(cfg.seed)  # before the policy exists: the seed fixes the initial weights
        vecenv = _make_envs(config, cfg.seed, folder, resumed, group)
        history = None
        try:
            ppo = _trainer(vecenv, config, cfg, options, resumed, group)
            history = History(folder / "history.jsonl" if main else None,
                              keep_until_iteration=ppo.iteration if resumed else None)
            checkpoints = Checkpoints(folder, options.checkpoint_every, options.checkpoint_minutes, options.keep,
                                      ppo.global_step, group)
            code, error = _train(ppo, config, options, folder, history, checkpoints, resumed, console, group)
        except KeyboardInterrupt:  # Ctrl-C before training started, or a second one while saving or plotting
            return _interrupted(folder, config["env"]["id"], errors) if main else \
                RunResult(EXIT_SIGINT, folder, None, 0, None)
        except BaseException:  # the run could not start: leave no empty run folder behind
            if history is None and main:
                _remove_if_empty(folder)
            raise
        finally:
            vecenv.close()
            if history is not None:
                history.close()
        result = _report(ppo, folder, config["env"]["id"], history, checkpoints, code, error, console, group, errors)
        if error is None and code in (EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM):
            _leave_together(group)
        return result
    except RuntimeError as err:  # a collective before or after training: a rank was lost
        if group.collective_error(err) and not isinstance(err, PackrlError):
            raise group.lost(err) from None
        raise
    finally:
        group.close()


def _make_envs(config: dict, seed: int, folder: Path, resumed: Resumed | None, group: Group) -> Any:
    """This rank's vector env, seeded apart from every other rank's; the run folder goes if it cannot be made."""
    try:
        return make_vecenv(config, seed=env_seed(seed, group.rank, group.world, int(config["vec"]["num_envs"])))
    except BaseException as err:
        if group.main:
            _remove_if_empty(folder)
        if resumed is not None and isinstance(err, ConfigError) and config["env"]["id"] != resumed.recorded_env:
            # a resume cannot change the backend: advice about it would be advice the user cannot follow
            raise resumed.refusal(f"the run's recorded [vec] settings (backend {config['vec']['backend']!r}) "
                                  "cannot step it; resume with the run's own env (leave ENV out), or start a new "
                                  "run for this one") from None
        raise


def _leave_together(group: Group) -> None:
    """The ranks of a run that ended well wait for each other (rank 0 has written everything by then). A signal
    after that has nothing left to stop: a torchrun worker ignores it from here on, so torchrun's SIGTERM to the
    ranks still exiting, sent when the first rank leaves with 143, does not cut them short."""
    group.barrier()
    if group.owned and launched_by_torchrun() and threading.current_thread() is threading.main_thread():
        for signum in SIGNAL_EXIT:
            signal.signal(signum, signal.SIG_IGN)


class RankZeroRefused(RunError):
    """Rank 0 refused the run (its folder or checkpoint); the other ranks stop with it and leave the message
    to rank 0 (``quiet``: the command prints nothing more)."""

    quiet = True


def _from_rank_zero(group: Group, decide: Any) -> str:
    """``decide()`` (a string) on rank 0, handed to every rank; a PackrlError there reaches every rank (rank 0
    raises its own, the others a quiet RankZeroRefused)."""
    if group.main:
        try:
            answer = decide()
        except PackrlError as err:
            group.broadcast_text(json.dumps({"error": str(err)}))
            raise
        group.broadcast_text(json.dumps({"answer": answer}))
        return answer
    told = json.loads(group.broadcast_text(None))
    if "error" in told:
        raise RankZeroRefused(f"rank 0 refused the run: {told['error']}")
    return told["answer"]


def _resume_from(options: RunOptions, given: dict, console: Console, group: Group) -> Resumed:
    """The newest loadable checkpoint of ``--resume`` (naming those skipped), its training state, and the config it
    recorded. Its env id is resolved as data: one naming code is refused unless the command line gives the env.
    In a data-parallel run rank 0 chooses the checkpoint and every rank loads it; its recorded world size must be
    this run's, and each rank continues from its own recorded training state."""
    found: list = []  # rank 0's choice, with what choosing it verified

    def choose() -> str:
        found.append(newest_checkpoint(options.resume))
        for line in found[0].skipped:
            console.print(escape(printable(f"skipped {line}")), highlight=False, soft_wrap=True)
        return json.dumps([str(found[0].checkpoint), None if found[0].run is None else str(found[0].run)])

    chosen, chosen_folder = json.loads(_from_rank_zero(group, choose))
    checkpoint_path, resume_folder = Path(chosen), None if chosen_folder is None else Path(chosen_folder)
    verified = verify(found[0].verified if found and found[0].verified is not None else checkpoint_path)
    metadata = verified.metadata
    if not isinstance(metadata.get("resume"), dict):
        raise RunError(f"--resume {checkpoint_path}: the checkpoint holds no training state to continue from")
    world, by_rank = checked_distributed(metadata, verified.file)
    rank, ranks = group.rank, group.world
    if world != ranks:
        how = f"torchrun --nproc-per-node {world} (over all nodes: {world} ranks)" if world > 1 else \
            "one process (without torchrun)"
        raise RunError(f"--resume {checkpoint_path}: the run was trained with world_size {world} (its metadata's "
                       f"distributed.world_size) and this one has {ranks}; each rank continues its own envs and "
                       f"random streams, so resume it with {how}")
    state = metadata["resume"] if rank == 0 else by_rank[rank]
    config = _resumed_config(metadata, checkpoint_path, given, options)
    _check_steps_left(metadata, config, checkpoint_path, options)
    if not options.env_given:  # a checkpoint is data: its env id never names code to run
        env = config["env"]
        try:
            env_creator(env["id"], env.get("kwargs"), env.get("api", "auto"), allow_code=False)
        except ConfigError:
            if is_data_env_id(env["id"]):
                raise
            raise RunError(f"--resume {options.resume}: the run's env id {env['id']!r} names code to import and "
                           "call, which is never run because a checkpoint recorded it; give the env on the command "
                           f"line: packrl train {shell_word(env['id'])} --resume {shell_word(options.resume)}"
                           ) from None
    return Resumed(config, checkpoint_path, resume_folder, verified, state)


def _check_steps_left(metadata: dict, config: dict, checkpoint: Path, options: RunOptions) -> None:
    """Refuse a resume with nothing to train (its total at or below the checkpoint's step): it would write a
    new checkpoint and say it trained."""
    step, total = metadata.get("global_step"), int(config["train"]["total_steps"])
    if type(step) is not int or total > step:
        return
    what = f"--total-steps {total:,} is" if options.total_steps_given else f"its recorded total_steps ({total:,}) is"
    raise RunError(f"--resume {checkpoint}: the run is at step {step:,} and {what} not above it, so there is "
                   f"nothing to train; give --total-steps above {step:,} to train it further")


def _run_folder(options: RunOptions, config: dict, resumed: Resumed | None, group: Group) -> Path:
    """The run folder: the resumed run's own (unless --out or --name asks for another), else a new one. A symlink
    planted where the run writes is refused before anything runs. In a data-parallel run rank 0 makes it and
    tells the other ranks its path (they never write there)."""
    return Path(_from_rank_zero(group, lambda: str(_make_run_folder(options, config, resumed))))


def _make_run_folder(options: RunOptions, config: dict, resumed: Resumed | None) -> Path:
    if resumed is not None and resumed.folder is not None and options.out is None and options.name is None:
        folder = resumed.folder
        mark(folder)  # a run folder from before the marker: adopted as packrl's own
    else:
        folder = new_run_folder(options, config["env"]["id"])
    for name in RUN_WRITES:
        inside(folder, name)
    return folder


def _trainer(vecenv: Any, config: dict, cfg: Any, options: RunOptions, resumed: Resumed | None,
             group: Group) -> Any:
    """PPO over the run's policy; a resumed run's architecture is checked against its weights (shapes and memory)
    before anything is allocated, then its training state loaded. In a data-parallel run PPO starts every rank
    from rank 0's weights, and each rank but 0 draws from generators of its own seed (``rank_seed``)."""
    if resumed is not None:
        try:
            check_fits(resumed.verified, vecenv, config["policy"], options.max_policy_bytes)
        except CheckpointError as err:
            raise resumed.refusal(err) from None
    ppo = PPO(vecenv, make_policy(vecenv, config["policy"]), cfg)
    if not group.main:
        seed_everything(rank_seed(cfg.seed, group.rank))
    if resumed is not None:
        policy_state, _, optimizer_state = load_checkpoint(resumed.verified)
        try:
            ppo.load_training_state(resumed.state, policy_state, optimizer_state)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
            raise RunError(f"--resume {resumed.checkpoint}: its training state does not fit this run "
                           f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    return ppo


def _train(ppo: Any, config: dict, options: RunOptions, folder: Path, history: History, checkpoints: Checkpoints,
           resumed: Resumed | None, console: Console, group: Group) -> tuple[int, BaseException | None]:
    """The training loop with its dashboard, history, periodic checkpoints and signals; the last checkpoint and the
    learning curve after it. ``(exit code, the error that stopped training or None)``.

    In a data-parallel run every rank runs this loop; once per iteration the ranks agree (one all-reduce,
    ``_agree``) on stopping (a signal to any rank stops all of them at that iteration), on a periodic checkpoint
    (rank 0's clock decides) and on the episode figures (over all ranks' episodes). Rank 0 alone writes history,
    dashboard, TensorBoard, checkpoints and the curve. A collective that fails (a rank lost) stops training
    with exit code 3 and nothing saved."""
    main = group.main
    env_id, total = config["env"]["id"], int(config["train"]["total_steps"])
    versus = _versus_check(env_id, config, options) if main else None
    title = _announce(ppo, env_id, options, folder, resumed, console, group)
    board = _dashboard(ppo, title, total, options, folder, console, main, versus is not None)
    stops = StopSignals()
    stops.board, stops.quiet = board, not main
    tracker = start_tracker(options.track if main else None, folder, config, console)  # W&B beside TensorBoard

    def callback(stats: dict) -> bool:
        if hasattr(ppo.env, "restarts"):  # the ray backend: lost env actors replaced so far (vector/ray_backend.py)
            stats["env_restarts"] = int(ppo.env.restarts)
        last = stats["global_step"] >= total  # a run shorter than the check interval still closes on its score
        if versus is not None and (stats["iteration"] % options.versus_every == 0 or last):
            stats.update(versus(ppo.policy, stats["iteration"]))
        due = main and stats["global_step"] < total and checkpoints.due(stats["global_step"])
        due = _agree(group, stats, stops, due)
        history.append(stats)
        board.update(stats)
        tracker.log(stats)
        if stops.received is None and due:
            checkpoints.save_periodic(ppo, config, history.rows)
        return stops.received is None

    with stops, board, tracker:
        code, error = _run_iterations(ppo, total, callback, history, group)
        if code == EXIT_OK:
            code, error = _save_last(ppo, config, history, checkpoints, stops, group)
        tracker.code = code
        if main:
            plot_learning_curve(history.rows, folder / "learning_curve.png", title)  # signals still just noted
    return code, error


def _announce(ppo: Any, env_id: str, options: RunOptions, folder: Path, resumed: Resumed | None,
              console: Console, group: Group) -> str:
    """Print what this run resumes (or the caller's preamble); the dashboard's title."""
    if resumed is not None:
        console.print(escape(printable(f"resuming {folder} from {resumed.checkpoint} (step {ppo.global_step:,}, "
                                       "its recorded settings)")), highlight=False, soft_wrap=True)
    elif options.preamble:
        console.print(escape(options.preamble), highlight=False, soft_wrap=True)
    ranks = f" x {group.world} ranks" if group.world > 1 else ""
    rows = ppo.env.num_agents
    return f"packrl PPO on {env_id} ({rows} row{'' if rows == 1 else 's'}{ranks}, {ppo.device})"


def _dashboard(ppo: Any, title: str, total: int, options: RunOptions, folder: Path, console: Console, main: bool,
               versus: bool) -> Any:
    """The live dashboard (a terminal on rank 0 only) with its TensorBoard writer."""
    return Dashboard(title, total, live=options.live and console.is_terminal and main,
                     tensorboard=_tensorboard_folder(options.tensorboard, folder) if main else None,
                     log_seconds=options.log_seconds, console=console, start_step=ppo.global_step, versus=versus)


def _run_iterations(ppo: Any, total: int, callback: Any, history: History,
                    group: Group) -> tuple[int, BaseException | None]:
    """``ppo.train`` to ``total`` steps; an error that stops training is written to history and returned."""
    try:
        ppo.train(total, callback)
    except (NonFiniteError, PackrlError) as err:
        history.append({"iteration": ppo.iteration + 1, "global_step": ppo.global_step,
                        **getattr(err, "stats", {}), "error": str(err)})
        return EXIT_STOPPED_BY_ERROR, err
    except KeyboardInterrupt:  # a second Ctrl-C: stop now, save nothing
        return EXIT_SIGINT, None
    except RuntimeError as err:  # a collective failed: the weights may be half updated, nothing is saved
        if not group.collective_error(err):
            raise
        error = group.lost(err)
        history.append({"iteration": ppo.iteration + 1, "global_step": ppo.global_step, "error": str(error)})
        return EXIT_STOPPED_BY_ERROR, error
    return EXIT_OK, None


def _save_last(ppo: Any, config: dict, history: History, checkpoints: Checkpoints, stops: StopSignals,
               group: Group) -> tuple[int, BaseException | None]:
    """After the last iteration: take a signal that came after its agreement, then save the last checkpoint."""
    code = EXIT_OK
    try:
        _agree(group, None, stops, False)  # a signal that came after the last iteration's agreement
        if stops.received is not None:
            code = SIGNAL_EXIT[stops.received]
        checkpoints.save_latest(ppo, config, history.rows)
    except (DivergedError, RuntimeError) as err:
        if not (isinstance(err, DivergedError) or group.collective_error(err)):
            raise
        return EXIT_STOPPED_BY_ERROR, err if isinstance(err, DivergedError) else group.lost(err)
    return code, None


def _agree(group: Group, stats: dict | None, stops: StopSignals, due: bool) -> bool:
    """One all-reduce per iteration: whether rank 0 asks for a periodic checkpoint (returned), the signals the
    ranks received (every rank takes the first stopping rank's signal, so all stop at this iteration), and the
    episodes ended on all ranks (``stats``' episode figures become their means over all ranks)."""
    episodes = float(stats.get("episodes", 0)) if stats is not None else 0.0
    values = [float(due), episodes,
              episodes * stats["episode_return"] if episodes else 0.0,
              episodes * stats["episode_length"] if episodes else 0.0]
    values += [float(stops.own or 0) if r == group.rank else 0.0 for r in range(group.world)]
    summed = group.sum(values)
    stopping = [r for r, signum in enumerate(summed[4:]) if signum]
    if stopping:
        stops.received, group.stopping = int(summed[4 + stopping[0]]), stopping
    if stats is not None and summed[1] != episodes:  # other ranks' episodes to merge in
        total_episodes = summed[1]
        stats["episodes"] = int(total_episodes)
        if total_episodes:
            stats["episode_return"] = summed[2] / total_episodes
            stats["episode_length"] = summed[3] / total_episodes
        else:
            stats.pop("episode_return", None)
            stats.pop("episode_length", None)
    return summed[0] > 0


def _interrupted(folder: Path, env_id: str, console: Console) -> RunResult:
    """Ctrl-C before training started, or a second one while saving or plotting: what was saved, and how to resume."""
    saved = _newest_saved(folder)
    if saved is None:
        _remove_if_empty(folder)
        console.print("[yellow]interrupted before training started; nothing saved[/yellow]")
        return RunResult(EXIT_SIGINT, None, None, 0, None)
    checkpoint, step = saved
    console.print(f"[yellow]interrupted (Ctrl-C); the last complete checkpoint is {_shown(checkpoint)} "
                  f"(step {step:,}); continue with: {_continue_with('packrl train', folder, env_id)}[/yellow]",
                  highlight=False, soft_wrap=True)
    return RunResult(EXIT_SIGINT, folder, checkpoint, step, None)


def _report(ppo: Any, folder: Path, env_id: str, history: History, checkpoints: Checkpoints, code: int,
            error: BaseException | None, console: Console, group: Group,
            errors: Console | None = None) -> RunResult:
    """The closing lines: why training stopped (an error, a signal) and how to continue, the last return, the run
    folder, the checkpoint with its hash and the learning curve. A rank other than 0 prints only its error (on
    stderr: its console is quiet) and reads nothing rank 0 wrote."""
    errors = errors or console
    returns = [h["episode_return"] for h in history.rows if isinstance(h.get("episode_return"), float)]
    last = returns[-1] if returns else None
    latest = checkpoints.latest
    if not group.main:
        if error is not None:
            os.write(2, (printable(f"packrl train: training stopped: {error_line(error, ppo)}") + "\n").encode())
        return RunResult(code, folder, latest, ppo.global_step, last)
    if error is not None:
        kept = f"the last good checkpoint is {_shown(latest)} (step {checkpoints.last_step:,})" if latest else \
            "no checkpoint had been saved yet"
        errors.print(f"[red]{_stop_prefix(errors, console)}training stopped: {_shown(error_line(error, ppo))}[/red]",
                     highlight=False, soft_wrap=True)
        errors.print(f"nothing of that iteration was saved; {kept}"
                      + ("; the env's traceback is in history.jsonl" if getattr(error, "env_traceback", None) else ""),
                      highlight=False, soft_wrap=True)
    elif code in (EXIT_SIGINT, EXIT_SIGTERM):
        why = "SIGTERM" if code == EXIT_SIGTERM else "SIGINT (Ctrl-C)"
        why += group.on_ranks(group.stopping)
        again = group.resume_command
        if latest is not None and checkpoints.last_step == ppo.global_step:
            errors.print(f"[yellow]interrupted by {why} at {ppo.global_step:,} steps; checkpoint saved; "
                         f"continue with: {_continue_with(again, folder, env_id)}[/yellow]", highlight=False,
                         soft_wrap=True)
        else:
            saved = _newest_saved(folder)  # this session's, or the one a resumed run started from
            resume = f"; the last checkpoint is {_shown(saved[0])} (step {saved[1]:,}); continue with: " \
                     f"{_continue_with('packrl train', folder, env_id)}" if saved is not None else ""
            errors.print(f"[yellow]interrupted at once by a second Ctrl-C at {ppo.global_step:,} steps; "
                         f"nothing saved from this session's last iteration{resume}[/yellow]", highlight=False,
                         soft_wrap=True)
    scores = closing_lines(history.rows)  # a zero-sum game closes on its score, not on its self-play return of 0
    for line in scores:
        console.print(line, highlight=False, soft_wrap=True)
    if last is not None and not scores:
        console.print(f"last mean episode return {last:.3f} after {ppo.global_step:,} agent steps", highlight=False, soft_wrap=True)
    console.print(escape(printable(f"run folder: {folder}")), highlight=False, soft_wrap=True)
    console.print(escape(printable(f"checkpoint: {latest if latest else '(none)'}"  # the manifest hash: eval --sha256
                  + (f" (sha256 {read_metadata(latest)['sha256']})" if latest else ""))), highlight=False, soft_wrap=True)
    console.print(curve_line(folder), highlight=False, soft_wrap=True, markup=False)  # without matplotlib: how to draw it
    return RunResult(code, folder, latest, ppo.global_step, last)


def _shown(path: Path | str) -> str:
    """A path in a line printed with rich markup: control characters escaped (``printable``), and brackets too, so
    an ``--out`` holding ``[/red]`` is shown, not read as markup."""
    return escape(printable(str(path)))


def _continue_with(command: str, folder: Path, env_id: str) -> str:
    """How to resume the run in ``folder``: ``command --resume FOLDER``, with the env in front for an env id that
    names code to import (a resume takes that only from the command line); shell-quoted, shown escaped."""
    env = "" if is_data_env_id(env_id) else f"{shell_word(env_id)} "
    return escape(f"{command} {env}--resume {shell_word(folder)}")


def _stop_prefix(errors: Console, console: Console) -> str:
    """``packrl train: `` before a stop line on a stream of its own (stderr), as the command's other errors."""
    return "packrl train: " if errors is not console else ""


def _tensorboard_folder(logdir: str | None, run: Path) -> str | None:
    """Where TensorBoard writes: a fresh subfolder, ``RUN/tensorboard`` (``--tensorboard`` alone) or
    ``LOGDIR/<run name>``, so the logger writes nothing outside a folder packrl just made."""
    if logdir is None:
        return None
    return str(fresh_subfolder(run, "tensorboard") if logdir == "" else fresh_subfolder(Path(logdir), run.name))


def error_line(error: BaseException, ppo: Any) -> str:
    """One line for an error that stopped training: where (iteration, rollout step when known, agent steps)
    and what. An env's error is its header and the last line of its traceback (the traceback itself goes to
    history.jsonl, not to the terminal)."""
    what = one_line(error)
    if what.startswith("iteration "):  # the NaN guard's message names them already
        return what
    where = f"iteration {ppo.iteration + 1}"
    step = getattr(ppo, "rollout_step", None)
    if step is not None:
        where += f", rollout step {step}"
    return f"{where} (after {ppo.global_step:,} agent steps): {what}"


def _newest_saved(folder: Path) -> tuple[Path, int] | None:
    """The run folder's newest complete checkpoint and its step, or None."""
    try:
        checkpoint = newest_checkpoint(folder).checkpoint
        step = read_metadata(checkpoint).get("global_step")
    except (PackrlError, CheckpointError, OSError):
        return None
    return checkpoint, step if type(step) is int else 0


def _remove_if_empty(folder: Path) -> None:
    """Remove a run folder that holds nothing but packrl's marker (a run that never started)."""
    try:
        if [p.name for p in folder.iterdir()] == [MARKER]:
            (folder / MARKER).unlink()
        folder.rmdir()
    except OSError:  # not empty (a resumed run's folder, or files written): keep it
        pass


def _resumed_config(metadata: dict, checkpoint: Path, given: dict, options: RunOptions) -> dict:
    """The recorded config of the run, checked as a config file would be, with what a resumed run may
    change: ``total_steps`` (to extend a run), ``device``, and the env when it was given on the command line."""
    file = checkpoint / "metadata.json"
    recorded = checked_config(metadata, file)  # env and policy within the bounds a checkpoint may claim
    config = config_settings.merge(config_settings.ConfigLayer(
        {k: v for k, v in recorded.items() if k in config_settings.SECTIONS}, f"{file} (config)"))
    if options.total_steps_given:
        config["train"]["total_steps"] = given["train"]["total_steps"]
    if options.device_given:
        config["train"]["device"] = given["train"]["device"]
    if options.env_given:
        config["env"] = copy.deepcopy(given["env"])
    return config


def _versus_check(env_id: str, config: dict, options: RunOptions) -> Any:
    """``check(policy, iteration) -> {"vs_random/win": ..., "vs_previous/reward": ...}`` for two-player zero-sum
    games (``versus.training_check``), else None."""
    if options.versus_every <= 0 or not is_two_player_zero_sum(env_id):
        return None
    return training_check(game_creator(env_id, config["env"].get("kwargs")), options.versus_games,
                          int(config["train"].get("seed", 0)))
