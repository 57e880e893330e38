"""One trial of a sweep, in a process of its own (``python -m packrl.sweep.trial SPEC``): an ordinary packrl run
(``train_run``, one torch thread) in the trial's run folder, watched by a thread that reads its history.jsonl as it
grows, reports the objective's intermediate value to Optuna at each report point and stops the run when the
pruner says so, or (``steps-to``) once the run reached the threshold and its value is known (SIGTERM to itself: the
run saves its checkpoint at the end of the iteration, as ``packrl train`` does). The trial tells Optuna its own
end: COMPLETE with its value, PRUNED, or FAIL for an error. Stopped from outside (the sweep's SIGTERM, or a sweep
that is gone) it tells nothing: the sweep marks it failed.

SPEC is JSON: study, trial_id, number, pruner, objective, budget, threshold, config, folder, parent.
The database URL comes in the environment (``storage.STORAGE_ENV``), never on the command line.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console

from packrl.errors import PackrlError
from packrl.history import read_history
from packrl.run_folders import error_line
from packrl.sweep.objective import Objective, final_return, report_points, steps_to
from packrl.sweep.storage import STORAGE_ENV, open_storage
from packrl.sweep.study import make_pruner
from packrl.torch_threads import apply_torch_threads
from packrl.train.session import RunOptions, train_run

POLL_SECONDS = 0.05
EXIT_STOPPED = 143


class Watcher(threading.Thread):
    """Reads the run's history as it grows; reports intermediate values and asks the pruner at each report point."""

    def __init__(self, history: Path, trial: Any, objective: Any, parent: int):
        super().__init__(daemon=True)
        self.history, self.trial, self.objective, self.parent = history, trial, objective, parent
        self.rows: list[dict] = []
        self.pruned = self.orphaned = self.reached = False
        self.done = threading.Event()
        self._offset = 0
        self._points = report_points(objective.budget)
        self._next = 0
        self._judged = 0  # history rows already checked against a steps-to threshold

    def run(self) -> None:
        while not self.done.wait(POLL_SECONDS):
            self.step()

    def step(self) -> None:
        """Read the new history lines, report, and stop the run when pruned or when the sweep is gone."""
        self._read()
        if os.getppid() != self.parent and not self.orphaned:  # the sweep was killed: stop, tell nothing
            self.orphaned = True
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if not self.rows or self.pruned or self.reached:
            return
        reached = None
        if self.objective.threshold is not None and len(self.rows) != self._judged:  # polled every 50 ms: judge new rows
            self._judged = len(self.rows)
            reached = steps_to(self.rows, self.objective.threshold)
        if reached is not None:
            self.reached = True  # its value is known: the rest of the budget could not change it
            os.kill(os.getpid(), signal.SIGTERM)  # stop at the end of the iteration under way, with a checkpoint
            # and the pruner compares later trials at every point with this one's value, as if it had run on
            while self._next < len(self._points):
                self._next += 1
                self.trial.report(float(reached), self._next)
            return
        step = int(self.rows[-1].get("global_step", 0))
        reported = False
        while self._next < len(self._points) and step >= self._points[self._next]:
            value = self.objective.intermediate(self.rows)
            self._next += 1
            if value is not None:
                self.trial.report(value, self._next)
                reported = True
        # one question for all the points this iteration crossed: the database is asked once, the run waits less
        if reported and self._next < len(self._points) and self.trial.should_prune():
            self.pruned = True
            os.kill(os.getpid(), signal.SIGTERM)  # stop at the end of the iteration under way, with a checkpoint

    def _read(self) -> None:
        try:
            size = self.history.stat().st_size
        except OSError:
            return
        if size != self._offset:
            self.rows = read_history(self.history)
            self._offset = size


def run_trial(spec: dict) -> int:
    """Train the trial's run and tell Optuna how it ended; the process's exit code."""
    apply_torch_threads(None)  # one thread, or OMP_NUM_THREADS (child_environment passes it on)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(os.environ[STORAGE_ENV])
    objective = Objective(spec["objective"], spec["budget"], spec.get("threshold"))
    study = optuna.load_study(study_name=spec["study"], storage=storage, pruner=make_pruner(spec["pruner"], objective.kind))
    trial = optuna.trial.Trial(study, spec["trial_id"])
    folder = Path(spec["folder"])
    watcher = Watcher(folder / "history.jsonl", trial, objective, spec["parent"])
    watcher.start()
    start = time.monotonic()
    try:
        result = train_run(spec["config"], RunOptions(out=str(folder), live=False, log_seconds=30.0,
                                                      checkpoint_minutes=None), Console(file=sys.stdout))
        code = result.code
    except PackrlError as err:
        watcher.done.set()
        _note(trial, failure=f"error: {error_line(err)}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        print(f"trial {spec['number']}: {error_line(err)}", file=sys.stderr)
        return 2
    wall = time.monotonic() - start
    watcher.done.set()
    watcher.join()
    if watcher.orphaned:
        return EXIT_STOPPED
    rows = read_history(folder / "history.jsonl")
    watcher.rows = rows
    steps = int(rows[-1]["global_step"]) if rows else 0
    reached = steps_to(rows, objective.threshold) if objective.threshold is not None else None
    attrs = {"wall_seconds": round(wall, 3), "agent_steps": steps, "return": final_return(rows),
             "steps_to": reached, "seed": spec["config"]["train"]["seed"], "folder": str(folder)}
    if watcher.pruned:
        _note(trial, **attrs)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return 0
    if code == 0 or watcher.reached:
        watcher.step()  # the report points the last iteration crossed
        value = objective.value(rows)
        _note(trial, **attrs)
        if value is None:
            _note(trial, failure="error: no episode ended within the budget, so there is no return to judge")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, value)
        return 0
    if code == 3:  # stopped by an error once training was under way (a non-finite loss, an env error)
        error = next((r["error"] for r in reversed(rows) if isinstance(r.get("error"), str)), "training stopped")
        _note(trial, **attrs, failure=f"error: {error.splitlines()[0] if error else error}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return 0
    return code  # stopped from outside: the sweep marks the trial failed (cut)


def _note(trial: Any, **attrs: Any) -> None:
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_trial(json.loads(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
