"""The Numba envs' time limit can be set where they are made: ``vector.make(name, n, backend="numba",
max_episode_steps=k)`` and ``envs.make(name, n, max_episode_steps=k)`` truncate every episode at step k
exactly (terminations before it stay terminations), as gymnasium's TimeLimit does."""
import numpy as np
import pytest

from packrl import envs, vector
from packrl.errors import UsageError


def _episodes(env, steps, actions):
    """Every ended episode's (length, terminated, truncated), stepping ``actions(t)``."""
    env.reset(seed=3)
    ended = []
    for t in range(steps):
        _, _, terms, truncs, _ = env.step(actions(t))
        for i in np.flatnonzero(terms | truncs):
            ended.append((int(env.episode_lengths[i]), bool(terms[i]), bool(truncs[i])))
    return ended


def test_cartpole_through_vector_make_truncates_at_the_step_given():
    env = vector.make("cartpole", 4, backend="numba", max_episode_steps=10)
    ended = _episodes(env, 35, lambda t: np.full(4, t % 2, np.int64))  # alternating pushes keep the pole up
    assert len(ended) == 12, ended  # 35 steps: each copy ends at 10, 20, 30
    assert all(length == 10 and trunc for length, _, trunc in ended), ended
    assert env.numba_env.max_episode_steps == 10


def test_without_the_argument_the_env_keeps_its_own_limit():
    env = vector.make("cartpole", 2, backend="numba")
    assert env.numba_env.max_episode_steps == envs.spec("cartpole").max_episode_steps == 500
    ended = _episodes(env, 40, lambda t: np.full(2, t % 2, np.int64))
    assert not any(trunc for _, _, trunc in ended), "the default 500-step limit cannot truncate within 40 steps"


def test_gridworld_terminations_before_the_limit_stay_terminations():
    env = envs.make("gridworld", num_envs=16, seed=0, max_episode_steps=7)
    rng = np.random.default_rng(0)
    ended = _episodes(env, 60, lambda t: np.stack([rng.integers(0, 4, 16), rng.integers(0, 2, 16)], axis=1))
    assert ended and all(length <= 7 for length, _, _ in ended)
    assert all(trunc == (length == 7) for length, _, trunc in ended), ended
    assert any(term and length < 7 for length, term, _ in ended), "some episodes reach the goal first"
    assert any(not term and trunc for length, term, trunc in ended), "and some are cut by the limit"
    assert env.numba_env.max_episode_steps == 7 and envs.spec("gridworld").max_episode_steps == 24


@pytest.mark.parametrize("bad", [0, -3, 2.5, "10", True])
def test_a_bad_time_limit_is_refused_naming_it(bad):
    with pytest.raises(UsageError, match="max_episode_steps must be an int >= 1"):
        vector.make("cartpole", 2, backend="numba", max_episode_steps=bad)
