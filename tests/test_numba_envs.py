"""Numba-native batched envs: CartPole against gymnasium transition by transition, autoreset and
final observations, per-copy seeding (batch sizes, processes, serial vs threaded), the env
protocol through vector backends, and bad kernels refused with the env and leaf named."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from numba import njit

import packrl.envs as envs
from packrl import EmulationError, EnvError
from packrl.envs import gridworld
from packrl.envs.numba_env import NumbaEnv
from packrl.nativize import nativize
from packrl.vector.numba_backend import make_numba

# ---------------------------------------------------------------- CartPole vs gymnasium


def _gym_cartpole() -> gymnasium.Env:
    env = gymnasium.make("CartPole-v1")
    env.reset(seed=0)
    return env


def test_cartpole_matches_gymnasium_from_identical_states():
    n = 4096
    env = envs.make("cartpole", num_envs=n, seed=0)
    env.reset()
    rng = np.random.default_rng(1)
    # states around the thresholds so that about a fifth of the transitions terminate
    states = np.stack([rng.uniform(-2.5, 2.5, n), rng.uniform(-3, 3, n), rng.uniform(-0.25, 0.25, n),
                       rng.uniform(-3, 3, n)], axis=1)
    actions = rng.integers(0, 2, n)
    env.state["physics"][:] = states
    obs, rewards, terminals, truncations, _ = env.step(actions)
    gym = _gym_cartpole()
    ended = 0
    for j in range(n):
        gym.unwrapped.state = states[j].copy()
        gym.unwrapped.steps_beyond_terminated = None
        g_obs, g_reward, g_term, g_trunc, _ = gym.step(int(actions[j]))
        assert bool(terminals[j]) == g_term and not truncations[j], j
        assert rewards[j] == g_reward, j
        if g_term:  # the ended episode's last observation; the row already holds a new episode
            ended += 1
            np.testing.assert_array_equal(env.final_observations[j], g_obs)
            assert np.all(np.abs(obs[j]) <= 0.05)
        else:
            np.testing.assert_array_equal(obs[j], g_obs)
            np.testing.assert_array_equal(env.state["physics"][j], gym.unwrapped.state)  # float64, bit for bit
    assert 400 < ended < n - 400


def test_cartpole_episode_matches_gymnasium_through_the_500_step_truncation():
    env = envs.make("cartpole", num_envs=1, seed=5)
    obs, _ = env.reset()
    gym = _gym_cartpole()
    gym.unwrapped.state = env.state["physics"][0].copy()
    for t in range(1, 501):
        action = int(obs[0, 2] + 0.5 * obs[0, 3] > 0)  # keeps the pole up for the whole episode
        obs, rewards, terminals, truncations, _ = env.step(np.array([action]))
        g_obs, g_reward, g_term, g_trunc, _ = gym.step(action)
        assert (bool(terminals[0]), bool(truncations[0]), float(rewards[0])) == (g_term, g_trunc, g_reward), t
        np.testing.assert_array_equal(env.final_observations[0] if g_trunc else obs[0], g_obs)
        if g_term or g_trunc:
            break
    assert (t, g_trunc, g_term) == (500, True, False)
    assert env.episode_lengths[0] == 500 and env.episode_returns[0] == 500.0
    assert np.all(np.abs(obs[0]) <= 0.05)  # autoreset: the next episode's first observation


# ---------------------------------------------------------------- gridworld: autoreset, final observations, thresholds


def _greedy(layout, rows: np.ndarray) -> np.ndarray:
    """Shortest path to the goal, read from the packed rows through nativize."""
    leaves = nativize(rows, layout)
    goal = leaves["image"][..., 1].reshape(len(rows), -1).argmax(1)
    dr, dc = goal // gridworld.SIZE - leaves["position"][:, 0], goal % gridworld.SIZE - leaves["position"][:, 1]
    heading = np.where(dr < 0, 0, np.where(dr > 0, 2, np.where(dc > 0, 1, 3)))
    return np.stack([heading, np.ones_like(heading)], axis=1)


def test_gridworld_autoreset_keeps_the_last_observation_and_starts_the_next_episode():
    env = envs.make("gridworld", num_envs=64, seed=3)
    layout = env.emulated.observation
    obs, _ = env.reset()
    assert obs.dtype == np.uint8 and obs.shape == (64, layout.nbytes)
    ends = 0
    for _ in range(12):
        before = obs.copy()
        obs, rewards, terminals, truncations, _ = env.step(_greedy(layout, obs))
        for j in np.flatnonzero(terminals):
            ends += 1
            last = layout.unpack(env.final_observations[j])
            goal = np.argwhere(last["image"][..., 1] == 255)[0]
            np.testing.assert_array_equal(last["position"], goal)  # the last observation: on the goal
            assert last["image"][goal[0], goal[1], 0] == 255
            assert rewards[j] > gridworld.GOAL_REWARD - gridworld.STEP_COST - 1e-6
            assert not np.array_equal(env.final_observations[j], before[j])
            first = layout.unpack(obs[j])
            assert not np.array_equal(first["position"], np.argwhere(first["image"][..., 1] == 255)[0])
    assert ends >= 64  # greedy reaches every goal within 8 steps
    assert not truncations.any()


def test_gridworld_truncates_every_copy_at_the_step_limit():
    env = make_numba("gridworld", 7, seed=0, episode_infos=True)
    env.reset()
    stay = np.zeros((7, 2), np.int64)  # face north without moving: never reaches the goal
    for t in range(1, gridworld.MAX_EPISODE_STEPS + 1):
        _, rewards, terminals, truncations, infos = env.step(stay)
        assert not terminals.any()
        assert truncations.all() == (t == gridworld.MAX_EPISODE_STEPS)
    np.testing.assert_array_equal(infos["episode_index"], np.arange(7))
    np.testing.assert_array_equal(infos["episode_length"], np.full(7, gridworld.MAX_EPISODE_STEPS))
    np.testing.assert_allclose(infos["episode_return"], -gridworld.STEP_COST * gridworld.MAX_EPISODE_STEPS)
    _, _, _, truncations, infos = env.step(stay)
    assert not truncations.any() and infos == {}


def test_gridworld_random_policy_stays_below_the_learned_threshold_and_greedy_clears_it():
    n = 2000
    env = envs.make("gridworld", num_envs=n, seed=11)
    env.reset()
    rng = np.random.default_rng(0)
    returns = {"random": [], "greedy": []}
    for policy in returns:
        env.reset(seed=11)
        for _ in range(120):
            if policy == "random":
                actions = np.stack([rng.integers(0, 4, n), rng.integers(0, 2, n)], axis=1)
            else:
                actions = _greedy(env.emulated.observation, env.observations)
            _, _, terminals, truncations, _ = env.step(actions)
            returns[policy] += env.episode_returns[terminals | truncations].tolist()
    random_mean, greedy_mean = np.mean(returns["random"]), np.mean(returns["greedy"])
    assert random_mean < gridworld.LEARNED_THRESHOLD < greedy_mean
    assert abs(random_mean - gridworld.RANDOM_RETURN) < 0.05 and abs(greedy_mean - gridworld.GREEDY_RETURN) < 0.05


# ---------------------------------------------------------------- seeding: batch sizes, threads, processes


def _rollout(env, steps: int, seed: int = 7) -> np.ndarray:
    """Observations of every step under actions drawn from a fixed numpy stream."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    out = []
    for _ in range(steps):
        obs, rewards, terminals, truncations, _ = env.step(rng.integers(0, 2, 4096)[: env.num_envs])
        out.append(np.concatenate([obs.reshape(env.num_envs, -1).view(np.uint8), env.final_observations.view(np.uint8),
                                   rewards[:, None].view(np.uint8), terminals[:, None].view(np.uint8),
                                   truncations[:, None].view(np.uint8)], axis=1))
    return np.stack(out)


@pytest.mark.parametrize("n", [1, 7])
def test_copy_j_is_the_same_episode_stream_in_any_batch_size(n):
    big = _rollout(envs.make("cartpole", num_envs=4096), 60)
    small = _rollout(envs.make("cartpole", num_envs=n), 60)
    np.testing.assert_array_equal(small, big[:, :n])
    assert not np.array_equal(big[:, 0], big[:, 1])  # copies do not share a stream


def test_serial_and_threaded_kernels_step_identically():
    serial = envs.make("cartpole", num_envs=513, threads=1)
    threaded = envs.make("cartpole", num_envs=513, threads=2)
    assert (serial.threads, threaded.threads) == (1, 2)
    np.testing.assert_array_equal(_rollout(serial, 80), _rollout(threaded, 80))


_CHILD = textwrap.dedent("""
    import hashlib, json, sys
    import numpy as np
    import packrl.envs as envs
    env = envs.make("gridworld", num_envs=33, seed=0)
    rng = np.random.default_rng(5)
    env.reset(seed=123)
    digest = hashlib.sha256()
    for _ in range(50):
        obs, rewards, terminals, truncations, _ = env.step(np.stack([rng.integers(0, 4, 33), rng.integers(0, 2, 33)], 1))
        for a in (obs, env.final_observations, rewards, terminals, truncations):
            digest.update(a.tobytes())
    print(json.dumps({"digest": digest.hexdigest(), "sources": [r.source for r in env.compile_records],
                      "report": env.compile_report}))
""")


def test_seeded_run_is_reproduced_in_another_process_which_loads_the_kernels_from_cache():
    env = envs.make("gridworld", num_envs=33, seed=0)
    rng = np.random.default_rng(5)
    env.reset(seed=123)
    digest = hashlib.sha256()
    for _ in range(50):
        obs, rewards, terminals, truncations, _ = env.step(np.stack([rng.integers(0, 4, 33), rng.integers(0, 2, 33)], 1))
        for a in (obs, env.final_observations, rewards, terminals, truncations):
            digest.update(a.tobytes())
    # quiet: the whole test takes under 1 s
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["digest"] == digest.hexdigest()
    assert result["sources"] == ["cache", "cache"], result["report"]


# ---------------------------------------------------------------- the protocol through vector backends


def test_vector_make_numba_and_set_buffers_write_into_caller_arrays():
    from packrl import vector

    env = vector.make(lambda: envs.spec("gridworld"), 5, backend="numba", seed=2)
    assert env.autoreset and env.num_agents == 5 and env.single_observation_space.shape == (80,)
    assert env.single_action_space == spaces.MultiDiscrete([4, 2])
    mine = [np.zeros_like(a) for a in (env.observations, env.final_observations, env.rewards, env.terminals,
                                       env.truncations, env.masks)]
    env.set_buffers(*mine)
    obs, _ = env.reset()
    assert obs is mine[0] and mine[5].all()
    env.step(np.ones((5, 2), np.int64))
    np.testing.assert_array_equal(mine[0], _rollout_reference(seed=2))


def _rollout_reference(seed: int) -> np.ndarray:
    ref = envs.make("gridworld", num_envs=5, seed=seed)
    ref.reset()
    return ref.step(np.ones((5, 2), np.int64))[0].copy()


def test_multiprocessing_workers_each_step_a_batched_env_like_one_big_batch():
    from packrl import vector

    creator = functools.partial(envs.make, "cartpole", num_envs=4, threads=1)
    venv = vector.make(creator, 3, backend="multiprocessing", num_workers=3, seed=10)
    try:
        assert venv.num_agents == 12
        big = envs.make("cartpole", num_envs=12)
        obs, _ = venv.reset(seed=10)
        np.testing.assert_array_equal(obs, big.reset(seed=10)[0])
        rng = np.random.default_rng(0)
        for _ in range(40):
            actions = rng.integers(0, 2, 12)
            obs, rewards, terminals, truncations, _ = venv.step(actions)
            b_obs, b_rewards, b_terms, b_truncs, _ = big.step(actions)
            np.testing.assert_array_equal(obs, b_obs)
            np.testing.assert_array_equal(terminals, b_terms)
            np.testing.assert_array_equal(venv.final_observations[terminals], big.final_observations[b_terms])
    finally:
        venv.close()


# ---------------------------------------------------------------- bad input

FAULTY_OBS = spaces.Dict({"x": spaces.Box(-1, 1, (2,), np.float32), "d": spaces.Discrete(3)})
FAULTY_ACTION = spaces.Dict({"mode": spaces.Discrete(4), "force": spaces.Box(-1.0, 1.0, (2,), np.float32)})


@njit
def faulty_reset(state, obs, rng):
    obs.x[0] = np.nan if state.poison[0] == 1 else 0.0
    obs.x[1] = 0.0
    obs.d[0] = 0


@njit
def faulty_step(state, action, obs, rng):
    mode = action.discrete[0]
    obs.x[0] = action.continuous[0]
    obs.x[1] = action.continuous[1]
    obs.d[0] = 1
    if mode == 1:
        obs.x[1] = np.nan
    elif mode == 2:
        obs.d[0] = state.nan_value[0]  # a float NaN written into the int64 Discrete leaf
    elif mode == 3:
        obs.d[0] = 7
    return 0.5, False, False


def _faulty(n: int) -> "envs.BatchedNumbaEnv":
    spec = NumbaEnv("faulty", FAULTY_OBS, FAULTY_ACTION, {"poison": (1, np.int64), "nan_value": (1, np.float64)},
                    faulty_reset, faulty_step)
    env = make_numba(spec, n)
    env.state["nan_value"][:] = np.nan
    return env


def _hybrid(modes, force=0.25) -> dict:
    modes = np.asarray(modes, np.int64)
    return {"discrete": modes[:, None], "continuous": np.full((len(modes), 2), force, np.float32)}


@pytest.mark.parametrize("mode, leaf, what", [(1, "['x']", "NaN"), (2, "['d']", "-9223372036854775808"), (3, "['d']", "value 7")])
def test_a_copy_writing_outside_its_leaf_space_is_named_and_other_rows_stay_intact(mode, leaf, what):
    env = _faulty(6)
    env.reset()
    pattern = rf"numba env 'faulty', env index 4: its step kernel wrote .*{what}.* into observation leaf \"?{re_escape(leaf)}"
    with pytest.raises(EnvError, match=pattern):
        env.step(_hybrid([0, 0, 0, 0, mode, 0]))
    rows = nativize(env.observations, env.emulated.observation)
    np.testing.assert_array_equal(np.delete(rows["x"], 4, axis=0), np.full((5, 2), 0.25, np.float32))
    np.testing.assert_array_equal(np.delete(rows["d"], 4), np.ones(5, np.int64))
    env.step(_hybrid([0] * 6))  # the error is reported once; a clean step goes through
    assert np.all(nativize(env.observations, env.emulated.observation)["d"] == 1)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_nan_written_by_reset_is_named():
    env = _faulty(3)
    env.state["poison"][2] = 1
    with pytest.raises(EnvError, match=r"'faulty', env index 2: its reset kernel wrote NaN into observation leaf \"\['x'\]\""):
        env.reset()


def test_out_of_range_and_mistyped_actions_are_refused_before_any_copy_steps():
    env = _faulty(4)
    env.reset()
    before = env.observations.copy()
    with pytest.raises(EmulationError, match=r"'faulty', env index 2: action .*outside the action space"):
        env.step(_hybrid([0, 0, 4, 0]))
    with pytest.raises(EmulationError, match=r"'faulty', env index 1: action .*outside the action space"):
        env.step(_hybrid([0, 0, 0, 0]) | {"continuous": np.array([[0, 0], [1.5, 0], [0, 0], [0, 0]], np.float32)})
    with pytest.raises(EmulationError, match="discrete actions must be integers"):
        env.step({"discrete": np.zeros((4, 1), np.float32), "continuous": np.zeros((4, 2), np.float32)})
    with pytest.raises(EmulationError, match=r"continuous actions must have shape \(4, 2\)"):
        env.step({"discrete": np.zeros((4, 1), np.int64), "continuous": np.zeros((3, 2), np.float32)})
    np.testing.assert_array_equal(env.observations, before)


@njit
def _ok_reset(state, obs, rng):
    obs[0] = 0.0


@njit
def _step_returning_ints(state, action, obs, rng):
    return 1.0, 1, 0


@njit
def _step_not_compiling(state, action, obs, rng):
    return state.velocity[0], False, False  # no such state field


def _box_env(step, reset=_ok_reset) -> NumbaEnv:
    return NumbaEnv("broken", spaces.Box(-1, 1, (1,), np.float32), spaces.Discrete(2), {"x": (1, np.float64)}, reset, step)


def test_kernels_that_do_not_compile_or_return_wrong_types_fail_at_build_naming_the_env():
    with pytest.raises(EnvError, match=r"numba env 'broken': step must return \(reward: float, terminated: bool, truncated: bool\)"):
        make_numba(_box_env(_step_returning_ints), 2)
    with pytest.raises(EnvError, match=r"numba env 'broken': its kernels do not compile[\s\S]*velocity"):
        make_numba(_box_env(_step_not_compiling), 2)
    with pytest.raises(EnvError, match=r"numba env 'broken': step must be an @numba.njit function"):
        _box_env(_step_returning_ints.py_func)
    with pytest.raises(EnvError, match="no packrl env named 'cartpol'"):
        envs.make("cartpol")


def test_the_batched_env_is_a_gymnasium_vector_env_and_refuses_use_after_close():
    from packrl import vector
    from packrl.vector.base import SAME_STEP

    env = vector.make("cartpole", 4, backend="numba", seed=0)
    assert isinstance(env, gymnasium.vector.VectorEnv) and env.num_envs == 4
    assert env.observation_space.shape == (4, 4) and env.action_space.shape == (4,)
    assert env.metadata["autoreset_mode"] == SAME_STEP
    env.reset(seed=0)
    env.step(np.zeros(4, np.int64))
    env.close()
    assert env.closed
    for call in (lambda: env.step(np.zeros(4, np.int64)), lambda: env.reset(seed=0), env.recv):
        with pytest.raises(EnvError, match="closed"):
            call()


_HELPER = "from numba import njit\n\n\n@njit(cache=True)\ndef reward_of(x):\n    return x + {bonus}\n"
_KERNELS = textwrap.dedent("""
    import numpy as np
    from gymnasium import spaces
    from numba import njit

    from bonus_helper import reward_of
    from packrl.envs.numba_env import NumbaEnv


    @njit(cache=True)
    def reset(state, obs, rng):
        obs[0] = 0.0


    @njit(cache=True)
    def step(state, action, obs, rng):
        obs[0] = 1.0
        return reward_of(1.0), False, False


    def spec():
        return NumbaEnv(name="helper_env", observation_space=spaces.Box(-2, 2, (1,), np.float32),
                        action_space=spaces.Discrete(2), state={"x": (1, np.float64)}, reset=reset,
                        step=step)
""")
_STEP_ONCE = textwrap.dedent("""
    import numpy as np
    import helper_env
    from packrl.envs.numba_env import BatchedNumbaEnv
    env = BatchedNumbaEnv(helper_env.spec(), 2, seed=0)
    env.reset(seed=0)
    print(env.step(np.zeros(2, np.int64))[1].tolist())
""")


def test_an_edited_helper_module_is_recompiled_in_the_next_process(tmp_path):
    """A kernel calling a jitted helper imported from another module: after the helper's file changes, the next
    process runs the new helper, not Numba's cached copy of the old one (its cache keys on the kernel's own file)."""
    (tmp_path / "helper_env.py").write_text(_KERNELS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[1])]),
           "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}

    def rewards(bonus):
        (tmp_path / "bonus_helper.py").write_text(_HELPER.format(bonus=bonus))
        # quiet: this file's tests take at most 3 s
        done = subprocess.run([sys.executable, "-c", _STEP_ONCE], capture_output=True, text=True, timeout=300,
                              env=env, cwd=tmp_path)  # quiet: about 8 s (two kernels compiled)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert rewards(1.0) == [2.0, 2.0]
    assert rewards(1.0) == [2.0, 2.0]  # from the cache
    assert rewards(5.0) == [6.0, 6.0]


def test_generated_kernel_source_is_never_written_through_a_planted_symlink(tmp_path, monkeypatch):
    """The kernel cache writes a new module through a temporary name made exclusively and unpredictably: a symlink
    planted at the name the cache once used (``.MOD.PID.tmp``) leaves its target alone, and the module is a
    file of its own."""
    from packrl._codegen import import_generated

    monkeypatch.setenv("PACKRL_NUMBA_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    modname = "packrl_test_planted_symlink_0123abcd"
    (tmp_path / "cache" / f".{modname}.{os.getpid()}.tmp").symlink_to(victim)
    try:
        module = import_generated(modname, "X = 1\n")
    finally:
        sys.modules.pop(modname, None)
    assert module.X == 1 and victim.read_text() == "the user's file\n"
    assert not (tmp_path / "cache" / f"{modname}.py").is_symlink()
