"""``packrl train`` with an env whose step blocks stops with one line naming the backend, the env and the step
(``--vec.step_timeout``, default 300 s), on the serial and the multiprocessing backends, instead of hanging
silently."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from packrl.config import VecConfig, defaults
from packrl.train.run import make_vecenv

ROOT = Path(__file__).resolve().parents[1]


class BlockingEnv(gym.Env):
    """CartPole-sized; env 0's third step blocks for ever (waits on an Event nobody sets)."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.index, self.steps = seed, 0  # packrl seeds env i with seed + i; the run's seed is 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.index == 0 and self.steps == 3:
            threading.Event().wait()
        return np.zeros(4, np.float32), 1.0, False, False, {}


def blocking_env():
    return BlockingEnv()


def test_packrl_train_has_a_300_s_step_timeout_by_default():
    assert VecConfig().step_timeout == 300.0
    config = defaults()
    config["env"]["id"] = "tests.test_step_timeout_train:blocking_env"
    for backend in ("serial", "multiprocessing"):
        config["vec"].update(backend=backend, num_envs=2)
        venv = make_vecenv(config)
        try:
            assert venv.step_timeout == 300.0, backend
        finally:
            venv.close()


@pytest.mark.parametrize("backend, says", [
    # the timeout under test (an env or service that hangs), not a bound on the test
    ("serial", "serial backend, env 0 did not finish within step_timeout=2.0 s and was interrupted: an env hangs "
               "(in its step 3)"),
    # the timeout under test (an env or service that hangs), not a bound on the test
    ("multiprocessing", "did not finish within step_timeout=2.0 s and was killed: an env hangs (in its step 3)"),
])
def test_a_blocking_env_stops_packrl_train_with_one_line(tmp_path, backend, says):
    """Quiet, the command takes about 10 s (start-up, two steps, the 2 s timeout); the bound is 150 s."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "packrl", "train", "tests.test_step_timeout_train:blocking_env", "--vec.backend", backend,
         "--vec.num_envs", "2", "--vec.step_timeout", "2", "--train.num_steps", "8", "--total-steps", "64",
         "--no-live", "--out", str(tmp_path / "run")],
        # quiet: the whole test takes 7 s
        capture_output=True, text=True, cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.monotonic() - start
    assert done.returncode == 3, (done.returncode, done.stderr[-3000:])
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("packrl")]
    assert len(lines) == 1 and says in lines[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    if backend == "multiprocessing":
        assert "multiprocessing backend: worker 0 (pid " in lines[0] and "env 0)" in lines[0], lines[0]
    assert took < 150, took
