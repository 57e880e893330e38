"""The README's multi-node recipe, simulated on one machine: a Ray cluster (started here, with its own token),
then examples/multinode_ppo.py under torchrun with two learner ranks (gloo), each a Ray driver whose env
actors run in that cluster. Exit 0, each rank has its own actor, training counts both ranks' steps (the
gradients are all-reduced: tests/test_ppo.py checks the ranks' weights stay equal), losses finite."""
import math
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ITERATION = re.compile(r"^iteration=(\d+) global_step=(\d+) pg_loss=(\S+) v_loss=(\S+)", re.M)
ACTORS = re.compile(r"^rank (\d): 1 actors on nodes \[.*\], pids \[(\d+)\]$", re.M)


HEAD = """
import sys, ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # the cluster lives until the test closes our stdin
ray.shutdown()
"""


@pytest.fixture
def cluster():
    """A Ray head in its own process (Ray reads its auth settings when it is imported), with a token of its
    own that the drivers torchrun starts present too (Ray >= 2.59 authenticates local clusters)."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    head = subprocess.Popen([sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        address = head.stdout.readline().strip()
        assert address, "the Ray head did not start"
        yield address, env
    finally:
        head.stdin.close()
        try:
            # quiet: this file's tests take at most 6 s
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()


def test_torchrun_learners_with_ray_env_workers(cluster):
    address, cluster_env = cluster
    env = {**cluster_env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2",
                           str(ROOT / "examples" / "multinode_ppo.py"), "--ray-address", address, "--num-envs", "4",
                           "--num-workers", "1", "--total-steps", "1024", "--num-steps", "64"],
                          # quiet: the whole test takes 6 s
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    actors = dict(ACTORS.findall(done.stdout))
    assert set(actors) == {"0", "1"} and actors["0"] != actors["1"], done.stdout
    iterations = ITERATION.findall(done.stdout)
    # each iteration: 2 ranks x 4 envs x 64 steps, counted over both ranks
    assert [(int(i), int(s)) for i, s, *_ in iterations] == [(1, 512), (2, 1024)], done.stdout
    assert all(math.isfinite(float(x)) for _, _, *losses in iterations for x in losses)
