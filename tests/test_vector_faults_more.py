"""More vector faults, under spawn and forkserver: workers go when the main process is SIGKILLed
while an env is blocked in step (no worker, fork server, resource tracker or /dev/shm entry
left); a KeyboardInterrupt in an env's step makes later calls refuse; env close errors in workers
and Ray actors are reported once everything is closed; ``step_timeout`` kills a hung worker."""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from packrl import EnvError, UsageError, vector
from packrl.vector.testing import CloseFails, HangingEnv, ScriptedEnv
from tests.processes import alive

SHM = Path("/dev/shm")
CONTEXTS = ["spawn", "forkserver"]



def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def assert_clean(pids, names):
    assert not wait_gone(pids, 10), "worker processes survived"
    present = {p.name for p in SHM.iterdir()}
    assert not [n for n in names if n in present], "shared memory left in /dev/shm"


@pytest.mark.parametrize("context", CONTEXTS)
def test_workers_go_when_the_main_process_is_killed_while_an_env_blocks(context, tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, time
        import numpy as np
        from multiprocessing import forkserver, resource_tracker
        from packrl import vector
        from packrl.vector.testing import HangingEnv
        if __name__ == "__main__":
            venv = vector.make(HangingEnv, 2, backend="multiprocessing", num_workers=2, main_envs=0,
                               context="{context}")
            venv.reset(seed=0)
            venv.send(np.zeros(2, np.int64))  # env 1 now sleeps in step
            time.sleep(0.5)
            helpers = [forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid]
            print(" ".join(map(str, venv.worker_pids)), "|", " ".join(str(p) for p in helpers if p), "|",
                  " ".join(venv.shared_names), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    out_file, err_file = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_file, "w") as out, open(err_file, "w") as err:  # files, not pipes: a survivor would hold a pipe
        # quiet: the whole test takes 1 s
        code = subprocess.run([sys.executable, "-c", script], stdout=out, stderr=err, timeout=120).returncode
    assert code == -signal.SIGKILL, err_file.read_text()
    workers, helpers, names = out_file.read_text().strip().split("|")
    pids = [int(p) for p in (workers + helpers).split()]
    assert len(pids) == (4 if context == "forkserver" else 3)  # workers, fork server, resource tracker
    survivors = wait_gone(pids, 30)  # quiet: gone within 1-2 s of the kill
    for pid in survivors:  # leave nothing behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"processes outlived the killed main process under {context}: {survivors}"
    deadline = time.monotonic() + 30  # the resource tracker unlinks the semaphores as it exits (quiet: < 1 s)
    while any((SHM / n).exists() for n in names.split()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [n for n in names.split() if (SHM / n).exists()], "/dev/shm entries left"


class Interrupted(ScriptedEnv):
    """The env seeded ``seed`` raises KeyboardInterrupt in its second step (as Ctrl-C would)."""

    def __init__(self, seed):
        super().__init__()
        self.interrupt_seed = seed

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed_ = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.seed_ == self.interrupt_seed and self.steps == 1:
            raise KeyboardInterrupt
        return super().step(action)


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_keyboard_interrupt_in_a_step_makes_later_calls_refuse(backend):
    # multiprocessing: the main process steps envs 2 and 3 itself (a worker ignores Ctrl-C)
    kwargs = {"num_workers": 1, "main_envs": 2, "context": "fork"} if backend == "multiprocessing" else {}
    env = 3 if kwargs else 1
    venv = vector.make(functools.partial(Interrupted, env), 4, backend=backend, **kwargs)
    venv.reset(seed=0)
    venv.step(np.zeros(4, np.int64))
    with pytest.raises(KeyboardInterrupt):
        venv.step(np.zeros(4, np.int64))
    for call in (lambda: venv.step(np.zeros(4, np.int64)), venv.reset, venv.recv):
        with pytest.raises(EnvError, match=f"env {env} was interrupted"):
            call()
    venv.close()


@pytest.mark.parametrize("context", CONTEXTS)
def test_close_errors_in_workers_are_reported_after_everything_closed(context):
    venv = vector.make(CloseFails, 4, backend="multiprocessing", num_workers=2, main_envs=0, context=context)
    pids, names = venv.worker_pids, venv.shared_names
    venv.reset(seed=0)
    venv.step(np.zeros(4, np.int64))
    with pytest.raises(EnvError, match=r"env 1's close raised OSError: close of env 1 failed \(and 1 more envs\)"):
        venv.close()
    assert venv.closed
    assert_clean(pids, names)


@pytest.mark.parametrize("context", CONTEXTS)
def test_step_timeout_kills_the_hung_worker_and_names_its_env(context):
    # the timeout under test (an env or service that hangs), not a bound on the test
    venv = vector.make(HangingEnv, 2, backend="multiprocessing", num_workers=2, context=context, step_timeout=6)
    assert venv.main_envs == 0  # every env in a worker, so each can be timed out
    pids, names = venv.worker_pids, venv.shared_names
    venv.reset(seed=0)  # env 1 (seed 1) hangs in step
    start = time.monotonic()
    # the timeout under test (an env or service that hangs), not a bound on the test
    with pytest.raises(EnvError, match=r"worker 1 \(pid \d+, env 1\) did not finish within step_timeout=6.0 s"):
        venv.step(np.zeros(2, np.int64))
    assert time.monotonic() - start < 60  # the timeout's 6 s, with 10x room for a busy machine: it fired, no hang
    assert not wait_gone([pids[1]], 30), "the hung worker was not killed"
    with pytest.raises(EnvError, match="failed earlier"):
        venv.step(np.zeros(2, np.int64))
    venv.close()
    assert_clean(pids, names)


def test_step_timeout_is_checked():
    for bad in (0, -1, "5", True, float("inf")):
        with pytest.raises(UsageError, match="step_timeout"):
            vector.make(ScriptedEnv, 2, backend="multiprocessing", num_workers=1, step_timeout=bad)
    with pytest.raises(UsageError, match="main_envs=1"):
        vector.make(ScriptedEnv, 2, backend="multiprocessing", num_workers=1, main_envs=1, step_timeout=5)


def test_ray_close_errors_and_step_timeout(ray_runtime):
    venv = vector.make(CloseFails, 2, backend="ray", num_workers=2)
    venv.reset(seed=0)
    venv.step(np.zeros(2, np.int64))
    with pytest.raises(EnvError, match="env 1's close raised OSError: close of env 1 failed"):
        venv.close()
    assert venv.closed and not venv.actors
    # the timeout under test (an env or service that hangs), not a bound on the test
    venv = vector.make(HangingEnv, 2, backend="ray", num_workers=2, step_timeout=5)
    venv.reset(seed=0)
    with pytest.raises(EnvError, match=r"ray worker\(s\) \[1\] \(envs 1..1\) did not finish within step_timeout"):
        venv.step(np.zeros(2, np.int64))
    with pytest.raises(EnvError, match="failed earlier"):
        venv.step(np.zeros(2, np.int64))
    venv.close()
    assert not venv.actors
