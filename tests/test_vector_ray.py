"""The ray backend on a real local Ray cluster: byte-for-byte equal to serial (CartPole, a Dict
env with episode ends, a multi-agent PettingZoo env, a batched Numba env, replies large enough
for the object store),
async batches, bad actions, env errors, killed workers, and no actors left after close."""
import functools
import gc
import os
import signal
import sys
import time

import gymnasium
import numpy as np
import pytest
import ray
import ray.cloudpickle

from packrl import EmulationError, EnvError, UsageError, vector
from packrl.emulation import Layout
from packrl.vector.testing import ScriptedEnv, SeededFailure, StructuredEnv
from tests.processes import alive

STEPS = 24


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_runtime):
    """The session's Ray runtime (tests/conftest.py: retried on a slow start, a failure under CI)."""
    # Ray workers may not have tests/ on sys.path: the envs defined here travel by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


BAD_ACTIONS = {  # for 4 envs of Discrete(3) actions
    "shape \\(3,\\)": np.zeros(3, np.int64),
    "dtype float32": np.zeros(4, np.float32),
    "row 2 \\(env 2, agent 0\\)": np.array([0, 1, 3, 0]),
    "row 1 \\(env 1, agent 0\\)": np.array([0, -1, 0, 0]),
}


def run(venv, actions, refuse_at=None):
    """Reset then step with each action batch; return copies of every array after each call.
    ``refuse_at``: before that step, offer each of BAD_ACTIONS, which must be refused."""
    out = []
    obs, infos = venv.reset(seed=7)
    out.append((obs.copy(), None, None, None, None, None, infos))
    for t, a in enumerate(actions):
        if t == refuse_at:
            before = venv.observations.copy()
            for message, bad in BAD_ACTIONS.items():
                with pytest.raises(EmulationError, match=message):
                    venv.step(bad)
                np.testing.assert_array_equal(venv.observations, before)
        obs, rew, term, trunc, infos = venv.step(a)
        out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy(), venv.final_observations.copy(),
                    venv.masks.copy(), infos))
    return out


def assert_same_runs(a, b):
    for step, (x, y) in enumerate(zip(a, b)):
        for name, u, v in zip(("obs", "rew", "term", "trunc", "final", "masks"), x[:6], y[:6]):
            if u is not None:
                assert u.tobytes() == v.tobytes(), f"{name} differs at step {step}"
        assert x[6] == y[6], f"infos differ at step {step}"



def assert_no_actors(pids, handles):
    """The actors' processes are gone and Ray reports the actors dead."""
    deadline = time.monotonic() + 60  # fault detection only (quiet: its callers take at most 3 s in all)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "actor processes survived close()"
    for handle in handles:
        with pytest.raises(ray.exceptions.RayActorError):
            # quiet: this file's tests take at most 4 s
            ray.get(handle.close.remote(), timeout=60)


@pytest.mark.parametrize("creator, num_envs, num_workers, high", [
    (functools.partial(gymnasium.make, "CartPole-v1"), 4, 2, 2),
    (ScriptedEnv, 4, 2, 3),  # Dict observation; episodes end by termination and truncation, with infos
    (StructuredEnv, 10, 1, 4),  # 10 x 12 KB rows in one reply: large enough to go through the object store
    ("mpe2", 2, 2, 5),  # PettingZoo Parallel: 2 agent rows per env, masks, max_cycles truncation
    ("numba", 2, 2, 2),  # batched Numba CartPole, 4 copies per env: autoreset inside step, seeds seed + 4 i + j
])
def test_ray_equals_serial_byte_for_byte(creator, num_envs, num_workers, high):
    if creator == "mpe2":
        from mpe2 import simple_spread_v3

        creator = functools.partial(simple_spread_v3.parallel_env, N=2, max_cycles=5)
    elif creator == "numba":
        from packrl import envs

        creator = functools.partial(envs.make, "cartpole", num_envs=4, threads=1)
    serial_env = vector.make(creator, num_envs, seed=3)
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, high, serial_env.num_agents) for _ in range(STEPS)]
    serial = run(serial_env, actions)
    with vector.make(creator, num_envs, backend="ray", num_workers=num_workers, seed=3) as venv:
        assert isinstance(venv, gymnasium.vector.VectorEnv)
        assert venv.observation_space == serial_env.observation_space
        assert venv.action_space == serial_env.action_space
        # Refused actions mid-run: had any reached a worker, the runs would differ from then on.
        got = run(venv, actions, refuse_at=STEPS // 2 if creator is ScriptedEnv else None)
        pids, handles = venv.worker_pids, venv.actors
    assert_same_runs(serial, got)
    assert any(x[2] is not None and (x[2] | x[3]).any() for x in serial) or creator is StructuredEnv
    assert_no_actors(pids, handles)


class JitteryEnv(ScriptedEnv):
    """ScriptedEnv whose steps take a random 0-10 ms, so workers reply in a random order."""

    def step(self, action):
        time.sleep(self.np_random.random() * 10e-3)
        return super().step(action)


def test_async_batches_bookkeeping():
    n, batch = 4, 2
    venv = vector.make(JitteryEnv, n, backend="ray", num_workers=4, batch_size=batch, seed=11,
                       actor_options={"num_cpus": 0.5})  # 4 workers on 2 cores
    layout = Layout.from_space(ScriptedEnv().observation_space)
    # Reference: each env alone; the action an env gets depends only on (env id, its step count).
    refs = [JitteryEnv() for _ in range(n)]
    ref_obs = [layout.pack(env.reset(seed=11 + i)[0]) for i, env in enumerate(refs)]
    steps = np.zeros(n, int)
    with pytest.raises(UsageError, match="async_reset"):
        venv.reset()
    venv.async_reset()
    with pytest.raises(UsageError, match="send\\(\\) without recv"):
        venv.send(np.zeros(batch, np.int64))
    seen = []
    deadline = time.monotonic() + 120  # fault detection only (quiet: the whole test takes 2 s)
    while (len(seen) < 24 or steps.min() < 3) and time.monotonic() < deadline:
        b = venv.recv()
        assert b.observations.shape[0] == batch and len(b.env_ids) == batch and len(b.infos) == batch
        assert list(b.env_ids) == sorted(b.env_ids)
        for row, e in enumerate(b.env_ids):
            np.testing.assert_array_equal(b.observations[row], ref_obs[e])
        with pytest.raises(UsageError, match="recv\\(\\) twice"):
            venv.recv()
        seen.append(tuple(b.env_ids))
        actions = np.array([(e * 7 + steps[e]) % 3 for e in b.env_ids])
        venv.send(actions)
        for e, a in zip(b.env_ids, actions):
            steps[e] += 1
            o, r, te, tr, _ = refs[e].step(a)
            if te or tr:
                o, _ = refs[e].reset()
            ref_obs[e] = layout.pack(o)
    assert steps.min() >= 3, f"an env was starved: steps per env {steps}"
    assert len(set(seen)) > 1  # batches are whoever replied first, not a fixed rotation
    venv.async_reset(seed=11)  # drops the replies in flight; every env starts over
    b = venv.recv()
    for row, e in enumerate(b.env_ids):
        np.testing.assert_array_equal(b.observations[row], layout.pack(ScriptedEnv().reset(seed=11 + int(e))[0]))
    venv.close()


def test_env_error_names_worker_env_and_traceback():
    venv = vector.make(SeededFailure, 4, backend="ray", num_workers=2)
    pids, handles = venv.worker_pids, venv.actors
    venv.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(EnvError) as err:
        for _ in range(5):
            venv.step(np.zeros(4, np.int64))
    assert time.monotonic() - start < 60  # fault detection only (no hang)
    text = str(err.value)
    assert "worker 1" in text and "env 3" in text and "Traceback" in text
    assert "scripted failure at step 3" in text and "testing.py" in text  # the env's own frame
    with pytest.raises(EnvError, match="failed earlier"):
        venv.step(np.zeros(4, np.int64))
    venv.close()
    assert_no_actors(pids, handles)


class SecondEnvFails:
    """A creator whose second call in each worker raises (each actor gets its own copy)."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls > 1:
            raise OSError("no such simulator")
        return ScriptedEnv()


def test_failing_creator_is_reported_and_leaves_no_actors():
    with pytest.raises(EnvError, match="(?s)ray worker 0, env 1 failed while starting.*Traceback.*no such simulator"):
        vector.make(SecondEnvFails(), 2, backend="ray", num_workers=1)
    # The actors held one CPU each: all of the cluster's CPUs free again means they are gone.
    deadline = time.monotonic() + 30  # fault detection only (quiet: the whole test takes under 1 s)
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == 2


def test_killed_worker_is_detected_and_gc_leaves_no_actors():
    # max_restarts=0: a lost actor ends the vector env (restarts: tests/test_vector_ray_restarts.py)
    venv = vector.make(ScriptedEnv, 4, backend="ray", num_workers=2, max_restarts=0)
    pids, handles = venv.worker_pids, venv.actors
    venv.reset(seed=0)
    os.kill(pids[0], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EnvError, match="ray worker 0 \\(envs 0..1\\) was lost .*max_restarts=0") as err:
        for _ in range(1000):
            venv.step(np.zeros(4, np.int64))
    assert time.monotonic() - start < 60  # fault detection only (no hang)
    assert err.value.worker == 0 and venv.restarts == 0
    del venv, err  # the error's traceback holds the vector env too
    gc.collect()  # garbage collection closes it: the surviving actor goes too
    assert_no_actors(pids, handles)


def test_workers_the_cluster_cannot_place_are_reported_not_waited_on_forever():
    with pytest.raises(EnvError, match="ray workers \\[0, 1\\] did not start within 2 s.*num_cpus"):
        vector.make(ScriptedEnv, 2, backend="ray", num_workers=2, actor_options={"num_cpus": 3}, start_timeout_s=2)
