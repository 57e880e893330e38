"""packrl's parallel Numba kernels leave torch's thread count alone: Numba's OpenMP layer (its default without TBB)
shares the process's OpenMP state with torch and MKL, so one parallel env step used to turn torch.set_num_threads(1)
into 2 (and a small policy's rollout 12x slower). Each check runs in a fresh interpreter: a threading layer is
chosen once per process, at the first parallel launch."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, numba, numpy as np, torch
torch.set_num_threads(1)
from packrl import vector
env = vector.make("gridworld", 2048, backend="numba", seed=0, threads=2)
env.reset(seed=0)
for _ in range(5):
    env.step(np.zeros((2048, 2), np.int64))
print(json.dumps({"layer": numba.threading_layer(), "torch_threads": torch.get_num_threads(),
                  "env_threads": env.threads}))
"""


def _run(extra_env: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    env.update(NUMBA_NUM_THREADS="2", **extra_env)
    # quiet: this file's tests take at most 2 s
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_parallel_env_step_keeps_torchs_thread_count():
    seen = _run({})
    assert seen["env_threads"] == 2  # the kernel did run in parallel
    assert seen["layer"] in ("workqueue", "tbb")
    assert seen["torch_threads"] == 1


@pytest.mark.parametrize("layer", ["omp", "workqueue"])
def test_a_threading_layer_the_user_chose_is_kept(layer):
    assert _run({"NUMBA_THREADING_LAYER": layer})["layer"] == layer
