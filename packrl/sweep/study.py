"""A sweep: an Optuna study of packrl runs, each trial a process of its own (``packrl.sweep.trial``) training an
ordinary run folder under ``SWEEP/trials/``.

    SWEEP/                       --out DIR (default sweeps/<study>)
      sweep.json                 the sweep's settings (the database URL with its password masked)
      study.db                   the study (SQLite), unless --storage names another database
      trials/<number>/           each trial's run folder: checkpoint/, history.jsonl (packrl eval, packrl plot)
      trials/<number>.log        what the trial printed
      best.toml                  the best trial's settings: packrl train --config best.toml
      sweep.lock                 held while a sweep runs in this folder

The sweep asks Optuna for trials (its seeded sampler, in this process), runs up to ``jobs`` at once, and stops when
the study holds ``trials`` finished ones (complete, pruned, or failed by an error): several sweeps sharing one
database count together. A trial cut mid-way (its process killed, the sweep killed or stopped by a signal) is
marked failed and does not count, so rerunning the same command runs another in its place; no finished trial runs
again.
"""
from __future__ import annotations

import copy
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from packrl import config as config_settings
from packrl.errors import EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, ConfigError
from packrl.run_folders import open_append, write_file
from packrl.sweep.objective import REPORTS
from packrl.sweep.options import PRUNERS, SAMPLERS, SweepError, SweepOptions  # noqa: F401 - SweepError re-exported
from packrl.sweep.show import write_best
from packrl.sweep.storage import child_environment, masked, open_storage, sqlite_url
from packrl.sweep.trials import CUT, OWNER, counts
from packrl.sweep.view import TrialView

POLL_SECONDS = 0.5
SURPLUS = "surplus: the study had its trials when it was asked for (sweeps sharing it asked at once)"


def make_sampler(name: str, seed: int) -> Any:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.RandomSampler(seed=seed)


def make_pruner(name: str, objective: str = "return") -> Any:
    """Optuna's median or Hyperband pruner over the REPORTS report points of a trial, or none. The median pruner
    waits a fifth of the budget on a ``return`` objective (early returns rank settings poorly) and only past the
    first point on ``steps-to``, where a trial that has not reached the threshold when most have already cannot
    catch up with them."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2 if objective == "steps-to" else REPORTS // 5)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=2, max_resource=REPORTS, reduction_factor=3)
    return optuna.pruners.NopPruner()


def quiet_optuna() -> None:
    """No warnings for what the sweep uses on purpose: heartbeats with ask/tell (the sweep records them itself)."""
    warnings.filterwarnings("ignore", category=ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def trial_seed(seed: int, number: int) -> int:
    """The training seed of trial ``number``: fixed by the sweep seed, different for every trial."""
    return int(np.random.SeedSequence([seed, number]).generate_state(1, np.uint32)[0])


def sampler_seed(seed: int, existing: int) -> int:
    """The sampler's seed: the sweep seed for a new study; a continued one (``existing`` trials) draws anew."""
    return seed if existing == 0 else int(np.random.SeedSequence([seed, existing]).generate_state(1, np.uint32)[0])


def identity(options: SweepOptions) -> dict:
    """What a study records and a sweep joining it must match: env, objective, budget, space."""
    return {"env": options.env, **options.objective.describe(), "space": options.space.describe(),
            "fixed_config": options.base}


# ---------------------------------------------------------------- the folder


class FolderLock:
    """An exclusive lock on SWEEP/sweep.lock: one sweep per folder at a time (the kernel drops it when the
    process dies, SIGKILL included)."""

    def __init__(self, folder: Path):
        self.path = folder / "sweep.lock"
        self.file: Any = None

    def __enter__(self) -> FolderLock:
        try:  # never through a symlink: the lock file is rewritten with this sweep's pid
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as err:
            raise SweepError(f"{self.path}: cannot be opened as the sweep's lock file ({err.strerror}); a sweep "
                             "never writes through a symlink") from None
        self.file = os.fdopen(fd, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise SweepError(f"sweep folder {self.path.parent} is in use by {holder}; wait for it or choose "
                             "another --out") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        self.file.flush()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.file.close()


# ---------------------------------------------------------------- the study


def open_study(options: SweepOptions, storage: Any) -> Any:
    """The study of ``options.study``: created with the sweep's identity, or joined when it was made by a sweep
    of the same env, objective, budget and space (else SweepError)."""
    study = optuna.create_study(study_name=options.study, storage=storage, load_if_exists=True,
                                direction=options.objective.direction,
                                pruner=make_pruner(options.pruner, options.objective.kind))
    wanted = identity(options)
    recorded = study.user_attrs.get("packrl")
    if recorded is None and not study.trials:
        study.set_user_attr("packrl", wanted)
        recorded = study.user_attrs.get("packrl", wanted)
    if recorded != wanted:
        differs = [k for k in ("env", "objective", "budget", "space", "fixed_config")
                   if not isinstance(recorded, dict) or recorded.get(k) != wanted[k]]
        raise SweepError(f"study {options.study!r} exists with another {', '.join(differs) or 'setup'} "
                         f"({_recorded_summary(recorded)}); choose another --study, or rerun with its settings")
    if study.direction.name.lower() != options.objective.direction:
        raise SweepError(f"study {options.study!r} exists with direction {study.direction.name.lower()}")
    return study


def _recorded_summary(recorded: Any) -> str:
    if not isinstance(recorded, dict):
        return "not made by packrl sweep"
    return f"env {recorded.get('env')}, objective {recorded.get('objective')}, budget {recorded.get('budget')}"


def trial_id(storage: Any, study_name: str, number: int) -> int:
    """The storage's key of trial ``number`` of the study, by Optuna's public storage API (its trial objects
    keep the key private)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study_name), number)


def fail_cut_trials(study: Any, storage: Any, owner: str, reason: str) -> list[int]:
    """Mark failed (cut) the running trials this sweep folder left behind (its last sweep was killed) and those
    whose sweep elsewhere stopped sending heartbeats; the numbers marked here."""
    optuna.storages.fail_stale_trials(study)
    marked = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.system_attrs.get(OWNER) == owner:
            key = trial_id(storage, study.study_name, t.number)
            storage.set_trial_user_attr(key, "failure", CUT)
            storage.set_trial_user_attr(key, "cut", reason)
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            marked.append(t.number)
    return marked


# ---------------------------------------------------------------- running trials


@dataclass
class Running:
    number: int
    trial_id: int
    process: subprocess.Popen
    folder: Path
    started: float
    log: Any


class Sweep:
    """The loop: ask, start, watch, end; stops at ``trials`` finished trials or at SIGINT/SIGTERM."""

    def __init__(self, options: SweepOptions, folder: Path, url: str, console: Any):
        self.options, self.folder, self.url, self.console = options, folder, url, console
        self.owner = f"{socket.gethostname()}:{folder.resolve()}"
        self.running: dict[int, Running] = {}
        self.stopping: int | None = None
        self.started = time.monotonic()

    def run(self) -> int:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        quiet_optuna()
        storage = open_storage(self.url, heartbeat=True)
        study = open_study(self.options, storage)
        self.storage = storage
        cut = fail_cut_trials(study, storage, self.owner, "its sweep was killed")
        if cut:
            self.console.print(f"marked failed (cut mid-way by a killed sweep): trial {', '.join(map(str, cut))}",
                               highlight=False)
        sampler = make_sampler(self.options.sampler, sampler_seed(self.options.seed, len(study.trials)))
        self.study = study = optuna.load_study(study_name=self.options.study, storage=storage, sampler=sampler,
                                               pruner=make_pruner(self.options.pruner, self.options.objective.kind))
        (self.folder / "trials").mkdir(exist_ok=True)
        view = TrialView(self, self.console, live=self.options.live)
        previous = {s: signal.signal(s, self._signal) for s in (signal.SIGINT, signal.SIGTERM)}
        last_beat = 0.0
        try:
            with view:
                while True:
                    trials = study.get_trials(deepcopy=False)
                    done, active = counts(trials)
                    if self.stopping is None:
                        while len(self.running) < self.options.jobs and done + active < self.options.trials \
                                and self.stopping is None:
                            self._start(study)
                            active += 1
                    self._reap(study)
                    if time.monotonic() - last_beat >= 1.0:
                        for r in self.running.values():
                            storage.record_heartbeat(r.trial_id)
                        optuna.storages.fail_stale_trials(study)
                        last_beat = time.monotonic()
                    view.update(study.get_trials(deepcopy=False))
                    if not self.running and (self.stopping is not None or counts(study.get_trials(deepcopy=False))[0]
                                             >= self.options.trials):
                        break
                    time.sleep(POLL_SECONDS)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for r in self.running.values():  # only on an error of the sweep itself: leave no trial behind
                r.process.kill()
        best = write_best(study, self.options.space, self.folder)
        view.summary(study.get_trials(deepcopy=False), best)
        if self.stopping is not None:
            name = signal.Signals(self.stopping).name
            print(f"packrl sweep: stopped by {name}; the trials it cut are marked failed; rerun the same command "
                  "to continue the study", file=sys.stderr)
            return EXIT_SIGTERM if self.stopping == signal.SIGTERM else EXIT_SIGINT
        return EXIT_OK

    def _signal(self, signum: int, frame: Any) -> None:
        if self.stopping is None:
            os.write(2, f"{signal.Signals(signum).name}: stopping the running trials (each saves its checkpoint)\n"
                     .encode())
        self.stopping = signum
        for r in self.running.values():
            try:
                r.process.send_signal(signal.SIGTERM)
            except OSError:
                pass

    def _start(self, study: Any) -> None:
        """Ask for a trial, build its config, start its process."""
        trial = study.ask()
        number, storage = trial.number, self.storage
        key = trial_id(storage, self.options.study, number)
        storage.set_trial_system_attr(key, OWNER, self.owner)
        storage.record_heartbeat(key)
        earlier = [t for t in study.get_trials(deepcopy=False) if t.number < number]
        if sum(counts(earlier)) >= self.options.trials:  # another sweep of the study asked at the same moment
            trial.set_user_attr("failure", SURPLUS)
            study.tell(trial, state=TrialState.FAIL)
            return
        params = self.options.space.suggest(trial)
        seed = trial_seed(self.options.seed, number)
        folder = self.folder / "trials" / f"{number:04d}"
        try:
            layer = _layers(self.options.base, params, seed)
            trial_config = config_settings.merge(config_settings.ConfigLayer(layer, f"trial {number}"))
        except ConfigError as err:  # a combination of values the settings refuse: nothing to train
            trial.set_user_attr("failure", f"error: {err}")
            study.tell(trial, state=TrialState.FAIL)
            return
        spec = {"study": self.options.study, "trial_id": key, "number": number,
                "pruner": self.options.pruner, "objective": self.options.objective.kind,
                "budget": self.options.budget, "threshold": self.options.objective.threshold,
                "config": trial_config, "folder": str(folder), "parent": os.getpid()}
        name = f"{number:04d}.log"
        write_file(self.folder / "trials", name, "")  # created as every file packrl writes: never through a symlink
        log = open_append(self.folder / "trials", name)
        process = subprocess.Popen([sys.executable, "-m", "packrl.sweep.trial", json.dumps(spec)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=child_environment(self.url), start_new_session=True)
        self.running[number] = Running(number, key, process, folder, time.monotonic(), log)

    def _reap(self, study: Any) -> None:
        """End the trials whose process exited; one that did not tell Optuna its end was cut: failed."""
        for number, r in list(self.running.items()):
            code = r.process.poll()
            if code is None:
                continue
            r.log.close()
            del self.running[number]
            state = self.storage.get_trial(r.trial_id).state
            if state != TrialState.RUNNING:
                continue
            if code > 0 and code not in (EXIT_SIGINT, EXIT_SIGTERM):  # the trial crashed: a failure that counts
                failure = f"error: exit status {code} (its output: {r.folder.name}.log)"
                self.storage.set_trial_user_attr(r.trial_id, "failure", failure)
            else:  # killed, or stopped by a signal: cut, and run again in its place
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
                if code in (EXIT_SIGTERM, -signal.SIGTERM) and self.stopping is not None:
                    how = f"stopped by the sweep's {signal.Signals(self.stopping).name}"
                self.storage.set_trial_user_attr(r.trial_id, "failure", CUT)
                self.storage.set_trial_user_attr(r.trial_id, "cut", how)
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)


def _layers(base: dict, params: dict, seed: int) -> dict:
    """A trial's config: the sweep's resolved base config, its sampled settings and its seed."""
    layer = copy.deepcopy(base)
    for section, values in params.items():
        layer.setdefault(section, {}).update(values)
    layer.setdefault("train", {})["seed"] = seed
    return layer


def run_sweep(options: SweepOptions, console: Any) -> int:
    """Run the sweep in its folder (locked while it runs); PackrlError for what stops it before any trial."""
    folder = Path(options.out) if options.out else Path("sweeps") / options.study
    if folder.exists() and not folder.is_dir():
        raise SweepError(f"--out {folder}: is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    url = options.storage or sqlite_url(folder)
    with FolderLock(folder):
        record = {"env": options.env, "study": options.study, "storage": masked(url),
                  "storage_is_default": options.storage is None, "trials": options.trials, "budget": options.budget,
                  "jobs": options.jobs, "sampler": options.sampler, "pruner": options.pruner,
                  "objective": options.objective.text(), "seed": options.seed, "space": options.space.describe()}
        write_file(folder, "sweep.json", json.dumps(record, indent=1) + "\n")
        return Sweep(options, folder, url, console).run()
