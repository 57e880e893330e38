"""The Ray backend and the runtime it may start: a vector env that started Ray stops it when the last one
using it closes (a runtime the caller started is left running), and ``step_timeout`` bounds steps, not a
reset that is only slow."""
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from packrl import EnvError, vector
from packrl.vector.testing import HangingEnv
from tests.ray_start import give_up

ROOT = Path(__file__).resolve().parents[1]

OWN_RUNTIME = """
import ray
from packrl import vector
from packrl.vector.testing import ScriptedEnv
from tests.ray_start import start_ray

first = vector.make(ScriptedEnv, 1, backend="ray", num_workers=1)
second = vector.make(ScriptedEnv, 1, backend="ray", num_workers=1)
first.close()
print("after first close", ray.is_initialized())
second.close()
print("after second close", ray.is_initialized())
start_ray()
third = vector.make(ScriptedEnv, 1, backend="ray", num_workers=1)
third.close()
print("caller's runtime after close", ray.is_initialized())
ray.shutdown()
"""


def test_a_ray_runtime_started_by_a_vector_env_stops_with_the_last_one():
    # quiet: the whole test takes 12 s
    done = subprocess.run([sys.executable, "-c", OWN_RUNTIME], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    if "timed out during startup" in done.stderr:
        give_up("Ray could not start on this machine: the node timed out during startup")  # CI: a failure
    lines = done.stdout.strip().splitlines()
    assert lines[-3:] == ["after first close True", "after second close False", "caller's runtime after close True"], \
        done.stdout + done.stderr[-3000:]


class SlowReset(HangingEnv):
    """Resets take 3 s (a busy machine); the env seeded 1 then hangs in step."""

    def reset(self, seed=None, options=None):
        time.sleep(3.0)
        return super().reset(seed=seed, options=options)


def test_step_timeout_bounds_steps_not_a_slow_reset(ray_runtime):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        # the timeout under test (an env or service that hangs), not a bound on the test
        venv = vector.make(SlowReset, 2, backend="ray", num_workers=2, step_timeout=1)
        try:
            venv.reset(seed=0)  # 3 s per reset: longer than step_timeout, and not killed
            with pytest.raises(EnvError, match=r"ray worker\(s\) \[1\] \(envs 1..1\) did not finish within "
                                               # the timeout under test (an env or service that hangs), not a bound on the test
                                               r"step_timeout=1.0 s"):
                venv.step(np.zeros(2, np.int64))
        finally:
            venv.close()
        # the timeout under test (an env or service that hangs), not a bound on the test
        venv = vector.make(SlowReset, 2, backend="ray", num_workers=2, reset_timeout=1)
        try:
            # the timeout under test (an env or service that hangs), not a bound on the test
            with pytest.raises(EnvError, match=r"did not finish within reset_timeout=1.0 s"):
                venv.reset(seed=0)
        finally:
            venv.close()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
