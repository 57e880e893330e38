"""Faults in the multiprocessing backend: env errors, killed workers, and cleanup of processes
and /dev/shm on close(), garbage collection and interpreter exit."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from packrl import EnvError, UsageError, vector
from packrl.vector.testing import ScriptedEnv, SeededFailure
from tests.processes import alive

SHM = Path("/dev/shm")



def our_names(venv):
    return venv.shared_names


def assert_clean(pids, names):
    deadline = time.monotonic() + 30  # quiet: the workers are gone within 0.5 s of close (busy CI: 60x margin)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], "worker processes survived"
    present = {p.name for p in SHM.iterdir()}
    assert not [n for n in names if n in present], "shared memory left in /dev/shm"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_env_error_names_worker_env_and_traceback_quickly(context):
    # 4 envs on 2 workers; every env's creator is the same, the failing env is chosen by its seed.
    venv = vector.make(SeededFailure, 4, backend="multiprocessing", num_workers=2, context=context)
    names, pids = our_names(venv), venv.worker_pids
    venv.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(EnvError) as err:
        for _ in range(5):
            venv.step(np.zeros(4, np.int64))
    # no hang: the failure arrives on the step that raised, not after a pipe timeout (bound loose: machines are shared)
    assert time.monotonic() - start < 20.0
    text = str(err.value)
    assert "worker 1" in text and "env 3" in text and "scripted failure at step 3" in text and "Traceback" in text
    with pytest.raises(EnvError, match="failed earlier"):
        venv.step(np.zeros(4, np.int64))
    venv.close()
    assert_clean(pids, names)


def test_env_error_in_the_main_process_share_names_env_and_traceback():
    # 4 envs: the worker steps 0..1, the main process 2..3; env 3 raises in the main process.
    venv = vector.make(SeededFailure, 4, backend="multiprocessing", num_workers=1, main_envs=2, context="fork")
    names, pids = our_names(venv), venv.worker_pids
    venv.reset(seed=0)
    with pytest.raises(EnvError) as err:
        for _ in range(5):
            venv.step(np.zeros(4, np.int64))
    text = str(err.value)
    assert "main process" in text and "env 3" in text and "scripted failure at step 3" in text and "Traceback" in text
    with pytest.raises(EnvError, match="failed earlier"):
        venv.step(np.zeros(4, np.int64))
    venv.close()  # the worker's command was in flight when the main process's env raised
    assert_clean(pids, names)


def test_serial_env_error_names_env_and_traceback_then_refuses_every_call():
    venv = vector.make(SeededFailure, 4)
    venv.reset(seed=0)
    with pytest.raises(EnvError, match="(?s)env 3 raised.*scripted failure"):
        for _ in range(5):
            venv.step(np.zeros(4, np.int64))
    # stepping on could hide the failed env's episode end
    for call in (lambda: venv.step(np.zeros(4, np.int64)), lambda: venv.reset(seed=0)):
        with pytest.raises(EnvError, match="failed earlier"):
            call()
    venv.close()


class WrongShapeAtStep2(gymnasium.Env):
    """A Box observation; the env seeded 2 returns one element too many on its second step."""

    observation_space = gymnasium.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed_, self.steps = seed, 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.steps += 1
        size = 5 if self.seed_ == 2 and self.steps == 2 else 4
        return np.zeros(size, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_a_wrong_observation_shape_names_the_env_and_the_shape(backend):
    kwargs = {"num_workers": 1, "context": "fork"} if backend == "multiprocessing" else {}
    venv = vector.make(WrongShapeAtStep2, 4, backend=backend, **kwargs)
    venv.reset(seed=0)
    venv.step(np.zeros(4, np.int64))
    with pytest.raises(EnvError) as err:
        venv.step(np.zeros(4, np.int64))
    assert "env 2" in str(err.value) and "shape (5,)" in str(err.value)
    venv.close()


def test_failing_creator_is_reported_and_cleaned_up():
    def creator():
        import os
        if os.getpid() != parent:
            raise ValueError("cannot build this env here")
        return ScriptedEnv()

    parent = os.getpid()
    before = {p.name for p in SHM.iterdir() if p.name.startswith("packrl_")}
    with pytest.raises(EnvError, match="(?s)worker 0.*env 0 raised.*cannot build this env here"):
        vector.make(creator, 2, backend="multiprocessing", num_workers=2, context="fork")
    after = {p.name for p in SHM.iterdir() if p.name.startswith("packrl_")}
    assert after <= before


@pytest.mark.parametrize("split", [{"num_workers": 2, "main_envs": 0}, {"num_workers": 2, "main_envs": 2}])
def test_sigkilled_worker_is_detected(split):
    # with main_envs=2 the main process steps envs 4..5 before it waits for the dead worker
    venv = vector.make(ScriptedEnv, 4 + split["main_envs"], backend="multiprocessing", context="fork", **split)
    names, pids = our_names(venv), venv.worker_pids
    venv.reset()
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EnvError, match="worker 1 .*envs 2..3.* killed by SIGKILL"):
        for _ in range(10):
            venv.step(np.zeros(venv.num_envs, np.int64))
    assert time.monotonic() - start < 20.0  # detected, not a hang (loose bound: machines are shared)
    venv.close()
    assert_clean(pids, names)


@pytest.mark.parametrize("split", [{"num_workers": 2, "main_envs": 0}, {"num_workers": 1, "main_envs": 2}])
def test_close_and_garbage_collection_leave_nothing(split):
    venv = vector.make(ScriptedEnv, 4, backend="multiprocessing", context="spawn", **split)
    names, pids = our_names(venv), venv.worker_pids
    obs, _ = venv.reset()
    assert all(alive(p) for p in pids)
    del venv
    gc.collect()
    assert_clean(pids, names)
    np.asarray(obs).sum()  # the user's views stay readable after the segment is gone


def test_interpreter_exit_without_close_leaves_nothing():
    script = textwrap.dedent("""
        import numpy as np
        from packrl import vector
        from packrl.vector.testing import ScriptedEnv, SeededFailure
        if __name__ == "__main__":
            venv = vector.make(ScriptedEnv, 4, backend="multiprocessing", num_workers=2, context="spawn")
            venv.reset()
            venv.step(np.zeros(4, np.int64))
            names = venv.shared_names
            print(" ".join(map(str, venv.worker_pids)), "|", " ".join(names), flush=True)
    """)
    # quiet: the whole test takes under 1 s
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pids, names = out.stdout.strip().split("|")
    assert "Traceback" not in out.stderr and "leaked" not in out.stderr, out.stderr
    assert_clean([int(p) for p in pids.split()], names.split())


@pytest.mark.parametrize("context", ["forkserver", "spawn", "fork"])
def test_workers_go_when_the_main_process_is_killed(context):
    script = textwrap.dedent(f"""
        import os, signal
        import numpy as np
        from packrl import vector
        from packrl.vector.testing import ScriptedEnv
        if __name__ == "__main__":
            venv = vector.make(ScriptedEnv, 4, backend="multiprocessing", num_workers=2, context="{context}")
            venv.reset()
            venv.step(np.zeros(4, np.int64))
            print(" ".join(map(str, venv.worker_pids)), "|", " ".join(venv.shared_names), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    # quiet: the whole test takes under 1 s
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pids, names = out.stdout.strip().split("|")
    pids = [int(p) for p in pids.split()]
    deadline = time.monotonic() + 30  # a worker notices within one blocking wait (1 s quiet; 30x for a busy CI)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], f"workers outlived the killed main process ({context})"


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_recv_before_any_reset_is_refused(backend):
    kwargs = {"num_workers": 2, "context": "fork"} if backend == "multiprocessing" else {}
    venv = vector.make(ScriptedEnv, 4, backend=backend, **kwargs)
    with pytest.raises(UsageError, match="before any reset"):
        venv.recv()
    venv.reset(seed=0)
    assert venv.step(np.zeros(4, np.int64))[0].shape[0] == 4
    venv.close()


CLOSED = []


class CloseRaises(ScriptedEnv):
    """The env seeded ``failing`` raises from close; every env records that close ran."""

    failing = 1

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed_ = seed
        return super().reset(seed=seed, options=options)

    def close(self):
        CLOSED.append(self.seed_)
        if self.seed_ == self.failing:
            raise OSError("close failed on purpose")


class LastCloseRaises(CloseRaises):
    failing = 3  # the main process steps envs 2 and 3 below


def test_an_env_whose_close_raises_still_lets_everything_close():
    CLOSED.clear()
    venv = vector.make(CloseRaises, 4)
    venv.reset(seed=0)
    with pytest.raises(EnvError, match="env 1's close raised OSError"):
        venv.close()
    assert sorted(CLOSED) == [0, 1, 2, 3] and venv.closed
    venv.close()  # closed already: nothing more to do
    with pytest.raises(EnvError, match="closed"):
        venv.step(np.zeros(4, np.int64))


def test_an_env_whose_close_raises_in_the_main_share_leaves_nothing():
    venv = vector.make(LastCloseRaises, 4, backend="multiprocessing", num_workers=1, main_envs=2, context="fork")
    names, pids = our_names(venv), venv.worker_pids
    venv.reset(seed=0)
    venv.step(np.zeros(4, np.int64))
    with pytest.raises(EnvError, match="close raised"):
        venv.close()
    assert venv.closed
    assert_clean(pids, names)


class UnpicklableInfo(ScriptedEnv):
    """The env seeded 0 returns an info holding a lambda."""

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed_ = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, ({"f": lambda: 0} if self.seed_ == 0 else info)


def test_an_info_that_cannot_travel_names_its_env():
    venv = vector.make(UnpicklableInfo, 4, backend="multiprocessing", num_workers=2, main_envs=0, context="fork")
    venv.reset(seed=0)
    with pytest.raises(EnvError) as err:
        venv.step(np.zeros(4, np.int64))
    assert "env 0 raised" in str(err.value) and "must pickle" in str(err.value)
    venv.close()
