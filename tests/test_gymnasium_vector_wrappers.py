"""gymnasium's own vector wrappers (RecordEpisodeStatistics, NormalizeReward, ClipReward) stacked on
every packrl backend give what they give on gymnasium's SyncVectorEnv (same-step autoreset) over the
same envs, seeds and actions; infos="dict" is gymnasium's dict of arrays with _key masks, final_obs
and final_info; call/get_attr/set_attr/render reach every env of every backend."""
import sys

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import ClipReward, NormalizeReward, RecordEpisodeStatistics
from hypothesis import given
from hypothesis import strategies as st

from packrl import EnvError, UsageError, vector
from packrl.emulation import Layout
from packrl.vector.testing import ScriptedEnv

BACKENDS = ["serial", "multiprocessing", "ray"]
NUM_ENVS = 4
STEPS = 120


@pytest.fixture(scope="module")
def ray_cluster(ray_runtime):
    """The session's Ray runtime (tests/conftest.py: retried on a slow start, a failure under CI)."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the creators here travel by value
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def cartpole():
    return gymnasium.make("CartPole-v1")


def cartpole_rgb():
    return gymnasium.make("CartPole-v1", render_mode="rgb_array")


class Raising(ScriptedEnv):
    def explode(self, value):
        raise RuntimeError(f"exploded with {value}")


def packrl_env(request, backend, creator, num_envs=NUM_ENVS, **kw):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
        return vector.make(creator, num_envs, backend="ray", num_workers=2, **kw)
    if backend == "multiprocessing":
        return vector.make(creator, num_envs, backend="multiprocessing", num_workers=1, context="fork", **kw)
    return vector.make(creator, num_envs, backend=backend, **kw)


def stack(env):
    # stats_key: ScriptedEnv's reset infos already use "episode"
    return RecordEpisodeStatistics(ClipReward(NormalizeReward(env, gamma=0.9), min_reward=-0.8, max_reward=0.8),
                                   stats_key="stats")


def native(obs, layout):
    """packrl rows as the observations SyncVectorEnv gives (CartPole rows already are)."""
    return obs if layout is None else layout.unpack(np.asarray(obs))


def assert_infos_equal(ours, theirs, layout, where):
    assert set(ours) == set(theirs), f"{where}: info keys {sorted(ours)} != {sorted(theirs)}"
    for key, value in theirs.items():
        if key == "stats":
            assert set(ours[key]) == set(value)
            np.testing.assert_allclose(ours[key]["r"], value["r"], rtol=1e-5, err_msg=where)
            np.testing.assert_array_equal(ours[key]["l"], value["l"], err_msg=where)
        elif key == "final_obs":
            for i, final in enumerate(value):
                if final is None:
                    assert ours[key][i] is None, where
                else:
                    mine = native(ours[key][i], layout)
                    for leaf in (mine if isinstance(mine, dict) else {"obs": mine}):
                        expected = final[leaf] if isinstance(final, dict) else final
                        np.testing.assert_array_equal(np.asarray(mine[leaf] if isinstance(mine, dict) else mine),
                                                      np.asarray(expected), err_msg=f"{where} final_obs {i}")
        elif isinstance(value, dict):
            assert_infos_equal(ours[key], value, layout, f"{where}/{key}")
        else:
            assert ours[key].dtype == value.dtype, f"{where}: {key} dtype {ours[key].dtype} != {value.dtype}"
            np.testing.assert_array_equal(ours[key], value, err_msg=f"{where}: {key}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("creator", [cartpole, ScriptedEnv], ids=["CartPole", "ScriptedDict"])
def test_wrappers_equal_sync(request, backend, creator):
    ours = stack(packrl_env(request, backend, creator, infos="dict"))
    theirs = stack(SyncVectorEnv([creator] * NUM_ENVS, autoreset_mode=AutoresetMode.SAME_STEP))
    layout = None if creator is cartpole else Layout.from_space(theirs.single_observation_space)
    rng = np.random.default_rng(3)
    ends = 0
    try:
        obs, info = ours.reset(seed=11)
        sync_obs, sync_info = theirs.reset(seed=11)
        assert_infos_equal(info, sync_info, layout, "reset")
        for t in range(STEPS):
            actions = rng.integers(0, ours.single_action_space.n, NUM_ENVS)
            obs, rew, term, trunc, info = ours.step(actions)
            sync_obs, sync_rew, sync_term, sync_trunc, sync_info = theirs.step(actions)
            where = f"{creator.__name__} on {backend}, step {t}"
            mine = native(obs, layout)
            for key in (mine if isinstance(mine, dict) else [None]):
                np.testing.assert_array_equal(mine if key is None else mine[key],
                                              sync_obs if key is None else sync_obs[key], err_msg=where)
            np.testing.assert_allclose(rew, sync_rew, rtol=1e-5, atol=1e-7, err_msg=where)
            np.testing.assert_array_equal(term, sync_term, err_msg=where)
            np.testing.assert_array_equal(trunc, sync_trunc, err_msg=where)
            assert_infos_equal(info, sync_info, layout, where)
            ends += int((term | trunc).sum())
        assert ends >= 8, f"only {ends} episode ends: the comparison saw too few"
        np.testing.assert_allclose(list(ours.return_queue), list(theirs.return_queue), rtol=1e-5)
        assert list(ours.length_queue) == list(theirs.length_queue)
    finally:
        ours.close()
        theirs.close()


def test_wrappers_on_the_numba_backend_count_what_the_env_counts():
    """The Numba backend returns a dict already; RecordEpisodeStatistics sees every episode end with
    the return and length the batched env itself recorded."""
    env = vector.make("cartpole", 16, backend="numba", seed=5)
    wrapped = RecordEpisodeStatistics(ClipReward(env, min_reward=0.0, max_reward=0.5))
    wrapped.reset(seed=5)
    rng = np.random.default_rng(0)
    expected = []
    for _ in range(200):
        _, rew, term, trunc, info = wrapped.step(rng.integers(0, 2, 16))
        np.testing.assert_array_equal(rew, np.full(16, 0.5))
        done = term | trunc
        expected += [(0.5 * env.episode_lengths[i], int(env.episode_lengths[i])) for i in np.flatnonzero(done)]
        if done.any():
            np.testing.assert_array_equal(info["_episode"], done)
    assert len(expected) > 50
    np.testing.assert_allclose(list(wrapped.return_queue), [r for r, _ in expected][-100:])
    assert list(wrapped.length_queue) == [n for _, n in expected][-100:]


def test_infos_list_stays_the_default_and_bad_forms_are_refused():
    with vector.make(cartpole, 2) as env:
        assert isinstance(env.reset(seed=0)[1], list)
    with pytest.raises(UsageError, match="infos='rows'"):
        vector.make(cartpole, 2, infos="rows")
    with pytest.raises(UsageError, match="backend 'numba'"):
        vector.make("cartpole", 2, backend="numba", infos="list")


@pytest.mark.parametrize("backend", BACKENDS)
def test_call_get_set_render(request, backend):
    env = packrl_env(request, backend, cartpole_rgb)
    sync = SyncVectorEnv([cartpole_rgb] * NUM_ENVS, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        env.reset(seed=2)
        sync.reset(seed=2)
        env.step(np.ones(NUM_ENVS, np.int64))
        sync.step(np.ones(NUM_ENVS, np.int64))
        frames, sync_frames = env.render(), sync.render()
        assert len(frames) == NUM_ENVS
        for mine, theirs in zip(frames, sync_frames):
            np.testing.assert_array_equal(mine, theirs)
        assert env.get_attr("gravity") == (9.8,) * NUM_ENVS
        env.set_attr("gravity", [1.0, 2.0, 3.0, 4.0])
        assert env.get_attr("gravity") == (1.0, 2.0, 3.0, 4.0)
        env.set_attr("force_mag", 7.5)
        assert env.call("spec")[0].id == "CartPole-v1"
        assert env.get_attr("force_mag") == (7.5,) * NUM_ENVS
        with pytest.raises(AttributeError, match="env 0: .*'no_such_thing'"):
            env.get_attr("no_such_thing")
        with pytest.raises(UsageError, match="3 values for 4 envs"):
            env.set_attr("gravity", [1.0, 2.0, 3.0])
        with pytest.raises(UsageError, match="call\\('step'\\)"):
            env.call("step", 0)
        env.step(np.zeros(NUM_ENVS, np.int64))  # still usable after refused and failed calls
    finally:
        env.close()
        sync.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_env_raising_in_a_call_names_it_and_leaves_the_vector_env_usable(request, backend):
    env = packrl_env(request, backend, Raising)
    try:
        env.reset(seed=0)
        with pytest.raises(EnvError, match="env 0 raised RuntimeError in a call: exploded with 7"):
            env.call("explode", 7)
        env.step(np.zeros(NUM_ENVS, np.int64))
        assert env.get_attr("episode") == (0,) * NUM_ENVS
    finally:
        env.close()


def test_the_numba_backend_says_why_there_are_no_env_objects():
    env = vector.make("cartpole", 4, backend="numba")
    for call in (lambda: env.render(), lambda: env.get_attr("x"), lambda: env.set_attr("x", 1),
                 lambda: env.call("x")):
        with pytest.raises(UsageError, match="rows of one compiled state"):
            call()


class _GymnasiumInfos(gymnasium.vector.VectorEnv):
    """gymnasium's own VectorEnv._add_info, on a vector env of n envs that does nothing else."""

    def __init__(self, n):
        self.num_envs = n


def _reference(infos, ended, rows):
    """What SyncVectorEnv (same-step autoreset) builds from the same per-env step and reset infos."""
    ref, out = _GymnasiumInfos(len(infos)), {}
    for i, info in enumerate(infos):
        if ended[i]:
            info = dict(info)
            reset_info = info.pop("reset_info", {})
            out = ref._add_info(out, {"final_obs": rows[i], "final_info": info}, i)
            info = reset_info
        out = ref._add_info(out, info, i)
    return out


def assert_same_tree(ours, theirs, where="infos"):
    assert set(ours) == set(theirs), f"{where}: {sorted(ours)} != {sorted(theirs)}"
    for key, value in theirs.items():
        if isinstance(value, dict):
            assert_same_tree(ours[key], value, f"{where}/{key}")
        else:
            assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, (where, key)
            for a, b in zip(ours[key].tolist(), value.tolist()):
                assert np.array_equal(a, b) if isinstance(b, (list, np.ndarray)) else a == b, (where, key, a, b)


# each key keeps one kind of value across envs (gymnasium types a key's array by the first env giving it)
_scalar_info = st.fixed_dictionaries({}, optional={
    "n": st.integers(-5, 5), "x": st.floats(-2, 2), "flag": st.booleans(), "s": st.text(max_size=3),
    "arr": st.integers(-9, 9).map(lambda v: np.array([v, -v], np.int32))})
_info = st.builds(lambda top, nested: {**top, **({"episode": nested} if nested is not None else {})},
                  _scalar_info, st.none() | _scalar_info)


@given(st.lists(st.tuples(_info, st.booleans(), _info), min_size=1, max_size=6))
def test_to_dict_is_what_gymnasium_builds(envs):
    """Any per-env step infos, episode ends and reset infos: packrl's to_dict equals gymnasium's own
    _add_info run env by env as SyncVectorEnv does in same-step mode (keys, masks, dtypes, values)."""
    from packrl.vector.infos import to_dict

    infos = [{**step, "reset_info": reset} if done and reset else step for step, done, reset in envs]
    ended = np.array([done for _, done, _ in envs])
    rows = np.arange(len(envs) * 3, dtype=np.uint8).reshape(len(envs), 3)
    assert_same_tree(to_dict(infos, ended, rows), _reference(infos, ended, rows))


@pytest.mark.parametrize("first, second", [
    ({"a": {}}, {"a": 0}),            # gymnasium: stores 0 under dict key 1
    ({"a": np.zeros(2)}, {"a": {}}),  # gymnasium: keeps the array, drops the dict
    ({"a": 1}, {"a": 1.5}),           # gymnasium: stores 1 (truncated)
    ({"a": False}, {"a": 3}),         # gymnasium: stores True
    ({"a": 1}, {"a": "x"}),           # gymnasium: ValueError from numpy
])
def test_to_dict_refuses_values_that_do_not_fit_by_key_and_env(first, second):
    """Where gymnasium's rule would fail, or store a value changed or not at all, packrl names the key and env."""
    from packrl.vector.infos import to_dict

    with pytest.raises(EnvError, match="info key 'a' of env 1 is .* does not fit"):
        to_dict([first, second])
