"""Starting Ray in tests on a busy machine: one runtime per pytest process, started with retries.

``ray.init`` gives up when its node has not registered within 30 s ("The current node timed out during
startup"), a limit Ray hard-codes (ray/_private/node.py). On a 2-core machine with other CPU-bound jobs that
happens now and then, so ``start_ray`` tries again, up to ``RAY_START_ATTEMPTS`` times with a growing pause
between tries (about 5 minutes in all; a quiet start takes 2-4 s on the project machine). The head processes a
failed try left behind (its GCS, raylet and workers, about 330 MB) are stopped before the next try, so tries do
not pile up and slow each other. When every try failed the calling test is skipped with Ray's own error, and
fails instead under CI (``CI`` set and not false): there a skip would hide the untested backend.
"""
from __future__ import annotations

import os
import time

import psutil
import pytest

RAY_START_ATTEMPTS = int(os.environ.get("PACKRL_TEST_RAY_ATTEMPTS", "5"))
PAUSES = (5, 15, 30, 60)  # seconds after failed tries 1, 2, 3 and 4 and on: time for the load to pass
OPTIONS = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}


def start_ray(**options) -> object:
    """``ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, **options)``, retried, unless this
    process already runs Ray (then nothing: the session's runtime is shared). When every try failed: the test
    is skipped with Ray's own error, or failed under CI (``give_up``)."""
    import ray

    if ray.is_initialized():
        return None
    error: BaseException | None = None
    for attempt in range(RAY_START_ATTEMPTS):
        before = _descendants()
        try:
            return ray.init(**{**OPTIONS, **options})
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for a start-up timeout
            error = err
            ray.shutdown()  # what ray.init registered goes
            stop_new_processes(before)  # and what it started but never registered (a node that timed out)
            if attempt + 1 < RAY_START_ATTEMPTS:
                time.sleep(PAUSES[min(attempt, len(PAUSES) - 1)])
    give_up(f"Ray could not start on this machine in {RAY_START_ATTEMPTS} attempts: "
            f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
    return None


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to anything but empty, 0 or false, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def give_up(reason: str) -> None:
    """Skip the calling test with ``reason``; under CI fail it (a skipped backend is an untested one)."""
    if in_ci():
        pytest.fail(f"{reason} (a failure, not a skip, because CI is set)", pytrace=False)
    pytest.skip(reason)


def _descendants() -> set[tuple[int, float]]:
    """This process's descendants as ``(pid, start time)``: a pid the system reused is another process."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            out.add((child.pid, child.create_time()))
        except psutil.NoSuchProcess:
            continue
    return out


def stop_new_processes(before: set[tuple[int, float]], grace: float = 10.0) -> list[int]:
    """Terminate, then kill after ``grace`` seconds, the descendants of this process that are not in ``before``
    (what a failed ``ray.init`` started); the pids stopped."""
    new = []
    for child in psutil.Process().children(recursive=True):
        try:
            if (child.pid, child.create_time()) not in before:
                new.append(child)
        except psutil.NoSuchProcess:
            continue
    for process in new:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(new, timeout=grace)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in new]
