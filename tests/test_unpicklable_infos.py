"""An env whose info holds a ``threading.Lock`` is reported as that: the env, the worker and the info's key, in
one line, the same on the multiprocessing and the Ray backend (Ray used to report a dead worker in ten lines
of its own colour codes)."""
import sys
import threading

import numpy as np
import pytest

from packrl import vector
from packrl.errors import EnvError
from packrl.run_folders import error_line
from packrl.vector.testing import ScriptedEnv


class LockInfo(ScriptedEnv):
    """The env seeded 0 returns an info holding a threading.Lock under "lock"."""

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed_ = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, ({"ok": 1, "lock": threading.Lock()} if self.seed_ == 0 else info)


def _refused(venv):
    try:
        venv.reset(seed=0)
        with pytest.raises(EnvError) as caught:
            venv.step(np.zeros(venv.num_envs, np.int64))
    finally:
        venv.close()
    return caught.value


def _check(err, worker_words):
    line = error_line(err)
    assert "\n" not in line and "\x1b" not in line, line
    assert worker_words in line and "env 0 raised: its info cannot be sent to the main process" in line, line
    assert "info['lock'] holds a _thread.lock: TypeError: cannot pickle '_thread.lock' object" in line, line
    assert "died" not in line, line
    assert err.env_index == 0


def test_multiprocessing_names_the_env_and_the_info_key():
    err = _refused(vector.make(LockInfo, 4, backend="multiprocessing", num_workers=2, main_envs=0))
    _check(err, "worker 0 (pid ")


def test_ray_names_the_env_and_the_info_key_as_multiprocessing_does(ray_runtime):
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors may not have tests/ on sys.path
    try:
        err = _refused(vector.make(LockInfo, 4, backend="ray", num_workers=2))
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    _check(err, "ray worker 0 (pid ")
    _check(err, "ray worker 0 (pid ")
