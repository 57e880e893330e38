"""Vector backends: episode ends, seeding, serial == multiprocessing byte for byte, async batches,
action checks and gymnasium interop, on real gymnasium / PettingZoo envs and real processes."""
import functools
import time

import gymnasium
import numpy as np
import pytest

from packrl import EmulationError, EnvError, UsageError, vector
from packrl.emulation import Layout
from packrl.vector.testing import ScriptedEnv, StructuredEnv

STEPS = 24


def run(venv, actions):
    """Reset then step with each action batch; return copies of every array after each call."""
    out = []
    obs, infos = venv.reset(seed=7)
    out.append((obs.copy(), None, None, None, None, infos))
    for a in actions:
        obs, rew, term, trunc, infos = venv.step(a)
        out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy(), venv.final_observations.copy(), infos))
    return out


def random_actions(n, steps=STEPS, seed=0, high=3):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, high, n) for _ in range(steps)]


def test_serial_matches_the_raw_envs_looped_by_hand():
    n = 3
    actions = random_actions(n)
    got = run(vector.make(ScriptedEnv, n), actions)
    layout = Layout.from_space(ScriptedEnv().observation_space)
    envs = [ScriptedEnv() for _ in range(n)]
    first = [env.reset(seed=7 + i)[0] for i, env in enumerate(envs)]
    np.testing.assert_array_equal(got[0][0], layout.pack_batch(first))
    ends = 0
    for t, a in enumerate(actions):
        obs, rew, term, trunc, final, _ = got[t + 1]
        for i, env in enumerate(envs):
            o, r, te, tr, _ = env.step(a[i])
            assert (rew[i], term[i], trunc[i]) == (np.float32(r), te, tr)
            if te or tr:
                ends += 1
                np.testing.assert_array_equal(final[i], layout.pack(o))  # the ended episode's last observation
                o, _ = env.reset()
            np.testing.assert_array_equal(obs[i], layout.pack(o))  # the next episode's first one after an end
    assert ends >= 2 * n  # the script ends episodes by termination and by truncation


def test_episode_end_step_is_visible_with_final_reward_and_flags():
    venv = vector.make(ScriptedEnv, 1)
    obs, _ = venv.reset(seed=1)  # episode 0 lasts 3 + 1 % 4 = 4 steps and terminates
    view = Layout.from_space(ScriptedEnv().observation_space).unpack
    for t in range(1, 5):
        obs, rew, term, trunc, _ = venv.step(np.array([2]))
    assert (rew[0], term[0], trunc[0]) == (np.float32(4.2), True, False)
    assert view(venv.final_observations[0])["t"] == 4 and view(venv.final_observations[0])["episode"] == 0
    assert view(obs[0])["t"] == 0 and view(obs[0])["episode"] == 1
    for t in range(5):  # episode 1 lasts 3 + 2 % 4 = 5 steps and truncates
        obs, rew, term, trunc, _ = venv.step(np.array([0]))
    assert (term[0], trunc[0]) == (False, True) and view(obs[0])["episode"] == 2


def test_same_seed_same_bytes_and_seed_plus_i():
    actions = random_actions(4)
    a, b = run(vector.make(ScriptedEnv, 4), actions), run(vector.make(ScriptedEnv, 4), actions)
    for x, y in zip(a, b):
        for u, v in zip(x[:5], y[:5]):
            np.testing.assert_array_equal(u, v)
    venv = vector.make(ScriptedEnv, 4)
    obs, _ = venv.reset(seed=100)
    seeds = Layout.from_space(ScriptedEnv().observation_space).unpack(obs)["seed"]
    np.testing.assert_array_equal(seeds, [100, 101, 102, 103])


def assert_same_runs(a, b):
    for step, (x, y) in enumerate(zip(a, b)):
        for name, u, v in zip(("obs", "rew", "term", "trunc", "final"), x[:5], y[:5]):
            if u is not None:
                assert u.tobytes() == v.tobytes(), f"{name} differs at step {step}"
        assert x[5] == y[5]


@pytest.mark.parametrize("creator, high", [
    (ScriptedEnv, 3),
    (functools.partial(gymnasium.make, "CartPole-v1"), 2),
    (StructuredEnv, 4),
])
@pytest.mark.parametrize("split", [
    {"num_workers": 2, "main_envs": 0},  # workers only
    {"num_workers": 1},  # the main process steps envs 2..3 (its equal share), the worker 0..1
    {"num_workers": 1, "main_envs": 3},  # an uneven split: the main process steps envs 1..3
])
def test_multiprocessing_equals_serial_byte_for_byte(creator, high, split):
    actions = random_actions(4, high=high)
    serial = run(vector.make(creator, 4, seed=3), actions)
    with vector.make(creator, 4, backend="multiprocessing", seed=3, context="fork", **split) as venv:
        assert venv.main_envs == split.get("main_envs", 2)
        assert venv.main_envs + venv.num_workers * venv.envs_per_worker == 4
        assert_same_runs(serial, run(venv, actions))


def test_default_split_gives_the_main_process_a_share_only_when_every_env_steps_at_once():
    import os

    from packrl.vector.multiprocessing import default_split

    cores = os.cpu_count() or 1
    for n in (1, 2, 7, 8, 64):
        workers, main = default_split(n, None, None, None)
        assert workers == max(1, min(cores - 1, n)) and (n - main) % workers == 0
        assert main <= n / (workers + 1) and n - main >= workers  # at most an equal share; every worker has envs
    assert default_split(8, 8, 1, None) == (1, 4)
    assert default_split(8, 8, 2, None) == (2, 2)
    assert default_split(5, None, 2, None) == (2, 1)
    assert default_split(8, 4, 2, None) == (2, 0)  # batches: the main process runs the policy
    with pytest.raises(UsageError, match="main_envs=2 needs batch_size == num_envs"):
        default_split(8, 4, 2, 2)
    with pytest.raises(UsageError, match="num_envs - main_envs = 8 - 8"):
        default_split(8, None, 1, 8)  # every worker steps at least one env


def test_spinner_stops_spinning_after_failed_spins_and_resumes_after_a_success():
    import multiprocessing

    from packrl.vector.multiprocessing import Spinner

    sem = multiprocessing.get_context("fork").Semaphore(0)
    spinner = Spinner(1e-6)
    assert not spinner.wait(sem) and (spinner.skip, spinner.backoff) == (1, 2)  # spun, nothing came
    assert not spinner.wait(sem) and spinner.skip == 0  # skipped the spin
    assert not spinner.wait(sem) and (spinner.skip, spinner.backoff) == (2, 4)
    sem.release()
    assert spinner.wait(sem)  # a posted semaphore is taken even while spins are skipped
    for _ in range(200):
        spinner.wait(sem)
    assert spinner.backoff == Spinner.MAX_SKIP
    spinner.skip = 0
    sem.release()
    assert spinner.wait(sem) and spinner.backoff == Spinner.MAX_SKIP  # taken before spinning
    assert not Spinner(0.0).wait(sem)  # no spinning at all


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@pytest.mark.parametrize("num_workers", [2, 1])  # 1: the main process steps env 1 (the lambda runs here too)
def test_start_methods(context, num_workers):
    actions = random_actions(2, steps=8)
    serial = run(vector.make(lambda: ScriptedEnv(), 2), actions)  # a lambda: creators are cloudpickled
    with vector.make(lambda: ScriptedEnv(), 2, backend="multiprocessing", num_workers=num_workers,
                     context=context) as venv:
        assert venv.context == context and venv.main_envs == 2 - num_workers
        assert_same_runs(serial, run(venv, actions))


def test_multi_agent_pettingzoo_rows_serial_equals_multiprocessing():
    from mpe2 import simple_spread_v3

    creator = functools.partial(simple_spread_v3.parallel_env, N=2, max_cycles=5)
    actions = random_actions(2 * 3, steps=12, high=5)
    serial_env = vector.make(creator, 3)
    assert serial_env.agents_per_env == 2 and serial_env.observations.shape == (6, serial_env.observations.shape[1])
    serial = run(serial_env, actions)
    assert any(x[3] is not None and x[3].all() for x in serial)  # max_cycles truncates every agent
    with vector.make(creator, 3, backend="multiprocessing", num_workers=3, context="fork") as venv:
        assert_same_runs(serial, run(venv, actions))
        assert venv.masks.shape == (6,)


class JitteryEnv(ScriptedEnv):
    """ScriptedEnv whose steps take a random 0-3 ms, so workers finish in a random order."""

    def step(self, action):
        time.sleep(self.np_random.random() * 3e-3)
        return super().step(action)


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_async_batches_bookkeeping(backend):
    n, batch = 6, 2
    kw = {"num_workers": 3, "context": "fork"} if backend == "multiprocessing" else {}
    venv = vector.make(JitteryEnv, n, backend=backend, batch_size=batch, seed=11, **kw)
    layout = Layout.from_space(ScriptedEnv().observation_space)
    # Reference: each env alone; the action an env gets depends only on (env id, its step count).
    refs = [JitteryEnv() for _ in range(n)]
    ref_obs = [layout.pack(env.reset(seed=11 + i)[0]) for i, env in enumerate(refs)]
    steps = np.zeros(n, int)
    venv.async_reset()
    with pytest.raises(UsageError, match="send\\(\\) without recv"):
        venv.send(np.zeros(batch, np.int64))
    seen = []
    for _ in range(40):
        b = venv.recv()
        assert b.observations.shape[0] == batch and len(b.env_ids) == batch and len(b.infos) == batch
        for row, e in enumerate(b.env_ids):
            np.testing.assert_array_equal(b.observations[row], ref_obs[e])
        seen += b.env_ids.tolist()
        actions = np.array([(e * 7 + steps[e]) % 3 for e in b.env_ids])
        venv.send(actions)
        for e, a in zip(b.env_ids, actions):
            steps[e] += 1
            o, r, te, tr, _ = refs[e].step(a)
            if te or tr:
                o, _ = refs[e].reset()
            ref_obs[e] = layout.pack(o)
    assert set(seen) == set(range(n))
    venv.close()


def test_bad_actions_refused_before_reaching_envs():
    venv = vector.make(ScriptedEnv, 4, backend="multiprocessing", num_workers=2, context="fork")
    obs, _ = venv.reset()
    before = obs.copy()
    bad = {
        "shape": (np.zeros(3, np.int64), "shape \\(3,\\)"),
        "dtype": (np.zeros(4, np.float32), "dtype float32"),
        "range": (np.array([0, 1, 3, 0]), "row 2 \\(env 2, agent 0\\)"),
        "negative": (np.array([0, -1, 0, 0]), "row 1"),
    }
    for name, (action, message) in bad.items():
        with pytest.raises(EmulationError, match=message):
            venv.step(action)
        np.testing.assert_array_equal(venv.observations, before)  # no env stepped
    venv.step(np.array([0, 1, 2, 0]))
    assert not np.array_equal(venv.observations, before)
    venv.close()


def test_gymnasium_vector_env_interop():
    venv = vector.make(functools.partial(gymnasium.make, "CartPole-v1"), 4)
    assert isinstance(venv, gymnasium.vector.VectorEnv)
    assert venv.num_envs == 4 and venv.single_observation_space.shape == (4,)
    assert venv.observation_space.shape == (4, 4) and venv.action_space.shape == (4,)
    obs, infos = venv.reset(seed=0)
    assert venv.observation_space.contains(obs)
    for _ in range(30):
        obs, rew, term, trunc, infos = venv.step(venv.action_space.sample())
        assert obs.shape == (4, 4) and rew.dtype == np.float32 and term.dtype == bool
    venv.close()
    assert venv.closed


def test_make_refuses_bad_configurations():
    with pytest.raises(UsageError, match="must divide"):
        vector.make(ScriptedEnv, 5, backend="multiprocessing", num_workers=2, main_envs=0)
    with pytest.raises(UsageError, match="main_envs=2 needs batch_size == num_envs"):
        vector.make(ScriptedEnv, 4, backend="multiprocessing", num_workers=1, batch_size=2, main_envs=2)
    with pytest.raises(UsageError, match="batch_size=3"):
        vector.make(ScriptedEnv, 4, batch_size=3)
    with pytest.raises(UsageError, match="must divide"):  # refused before any Ray cluster starts
        vector.make(ScriptedEnv, 5, backend="ray", num_workers=2)
    with pytest.raises(UsageError, match="unknown backend"):
        vector.make(ScriptedEnv, 4, backend="threads")
    venv = vector.make(ScriptedEnv, 4, batch_size=2)
    with pytest.raises(UsageError, match="async_reset"):
        venv.reset()


def test_counts_and_seeds_must_be_ints_that_fit():
    cartpole = functools.partial(gymnasium.make, "CartPole-v1")
    for kwargs, words in [({"num_envs": 2.0}, "num_envs must be an int"),
                          ({"num_envs": 4, "batch_size": 2.0}, "batch_size must be an int"),
                          ({"num_envs": 4, "batch_size": True}, "batch_size must be an int"),
                          ({"num_envs": 4, "backend": "multiprocessing", "num_workers": 2.5}, "num_workers must be an int"),
                          ({"num_envs": 4, "seed": -1}, "seed must be an int"),
                          ({"num_envs": 4, "seed": 2**63 - 2}, "seed must be an int"),
                          ({"num_envs": 4, "seed": 1.5}, "seed must be an int")]:
        with pytest.raises(UsageError, match=words):
            vector.make(cartpole, **kwargs)
    venv = vector.make(cartpole, 4, seed=np.int64(3))
    first, _ = venv.reset()
    again, _ = venv.reset(seed=np.int64(3))  # a NumPy int seed works like a Python one
    np.testing.assert_array_equal(first, again)
    with pytest.raises(UsageError, match="seed must be an int"):
        venv.reset(seed=2**63)
    venv.close()


class _RefusedObservationAt2(gymnasium.Env):
    """Env with seed 2 (mod 4) returns a Discrete leaf outside its space on its first step."""
    observation_space = gymnasium.spaces.Dict({"a": gymnasium.spaces.Discrete(3), "b": gymnasium.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.bad = seed % 4 == 2
        return {"a": 0, "b": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"a": 5 if self.bad else 1, "b": np.zeros(2, np.float32)}, 0.0, False, False, {}


def test_serial_block_step_names_the_env_whose_observation_is_refused():
    # the serial backend packs a block of envs' observations at once; the error must name env 2, not the block's first
    venv = vector.make(_RefusedObservationAt2, 4, backend="serial")
    venv.reset(seed=0)
    with pytest.raises(EnvError, match=r"env 2 raised(.|\n)*leaf \['a'\]"):
        venv.step(np.zeros(4, np.int64))
    venv.close()
