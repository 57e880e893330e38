"""The Numba connect_four against PettingZoo's connect_four_v3 through emulation, move by move: vector.make of both
gives equal rows (observation planes and action masks), masks (only the mover's row), rewards and flags, through
wins, games in progress and same-step resets."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pettingzoo.classic import connect_four_v3

import packrl.envs as envs
from packrl import vector


def legal_random_actions(env, rng):
    """One legal move in each copy's mover row (the action_mask leaf), zeros elsewhere."""
    layout = env.emulated.observation
    acts = np.zeros(env.num_agents, np.int64)
    for row in np.flatnonzero(env.masks):
        acts[row] = rng.choice(np.flatnonzero(layout.unpack(env.observations[row])["action_mask"]))
    return acts


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_envs=st.integers(1, 3))
def test_moves_match_pettingzoo(seed, num_envs):
    ref = vector.make(connect_four_v3.env, num_envs, backend="serial", seed=0)
    ours = vector.make("connect_four", num_envs, backend="numba", seed=0)
    assert (ours.num_agents, ours.agents_per_env, tuple(ours.possible_agents)) == \
        (ref.num_agents, ref.agents_per_env, tuple(ref.possible_agents))
    assert ours.emulated.observation == ref.emulated.observation
    assert ours.emulated.action_mask == ref.emulated.action_mask == ("action_mask",)
    o1, _ = ref.reset(seed=0)
    o2, _ = ours.reset(seed=0)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(ref.masks, ours.masks)
    rng = np.random.default_rng(seed)
    games = 0
    for t in range(120):
        acts = legal_random_actions(ref, rng)
        r1, r2 = ref.step(acts), ours.step(acts)
        for k, what in enumerate(("observations", "rewards", "terminals", "truncations")):
            np.testing.assert_array_equal(r1[k], r2[k], err_msg=f"move {t}: {what}")
        np.testing.assert_array_equal(ref.masks, ours.masks, err_msg=f"move {t}: masks")
        ended = r1[2] | r1[3]
        np.testing.assert_array_equal(ref.final_observations[ended], ours.final_observations[ended])
        games += int(ended.sum()) // 2
    assert games >= num_envs  # every copy finished at least one game


def test_a_move_into_a_full_column_loses_as_pettingzoos_illegal_move_does():
    env = envs.make("connect_four", num_envs=1)
    env.reset()
    for move in range(6):  # both players fill column 0
        env.step(np.zeros(2, np.int64))
    assert not env.terminals.any()
    _, rewards, terminals, _, _ = env.step(np.zeros(2, np.int64))  # player_0 plays the full column
    assert terminals.all() and rewards.tolist() == [-1.0, 0.0]
    assert env.masks.tolist() == [True, False]  # the next game began: player_0 to move


def test_only_the_movers_row_is_shown():
    env = envs.make("connect_four", num_envs=2)
    obs, _ = env.reset()
    assert env.masks.tolist() == [True, False, True, False]
    assert not obs[1].any() and not obs[3].any()
    obs, *_ = env.step(np.array([3, 0, 3, 0]))
    assert env.masks.tolist() == [False, True, False, True]
    assert not obs[0].any() and obs[1].any()


@pytest.mark.slow
def test_self_play_with_the_defaults_beats_a_random_opponent(one_torch_thread):
    """`packrl train connect_four` (the pettingzoo-classic preset, self-play) for 1M agent steps on seeds 0-2, each
    policy playing 200 greedy games against a uniformly random legal opponent on PettingZoo's own connect_four_v3
    (seats alternating): the best of the three meets issue 40's 0.9 win rate and their mean is 0.85 or more. A
    seed's trajectory follows the CPU's float kernels and self-play swings between checks, so no single seed is held
    to 0.9. Measured at 1M: 0.95, 0.98, 0.94 (400 games) on an Intel Xeon; on an AMD EPYC 0.955, 0.825, 0.895 (mean
    0.892) with avx2 and 0.900, 0.925, 0.925 with default kernels (benchmarks/learning.py --tasks
    numba-connect_four, benchmarks/README.md). Untrained, greedy play (one column, stacked) wins 0.73, 0.715 and
    0.855 (mean 0.767): both asserts fail for it. About 80-140 s of training a seed on one core."""
    from packrl import config as settings_
    from packrl.train.run import build_ppo
    from packrl.train.versus import versus_random

    wins = []
    for seed in range(3):
        config, preset = settings_.resolve(flags={"env": {"id": "connect_four"},
                                                  "train": {"seed": seed, "total_steps": 1_000_000}})
        assert preset.name == "pettingzoo-classic"
        ppo = build_ppo(config)
        ppo.train(1_000_000)
        ppo.env.close()
        wins.append(versus_random(ppo.policy, connect_four_v3.env, games=200, seed=123, greedy=True)["win"])
    assert max(wins) >= 0.9, wins
    assert np.mean(wins) >= 0.85, wins
