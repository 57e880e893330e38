"""Game metrics that fit the game: besides win/draw/loss, the mean reward per game (chips in poker) with its 95%
interval, against a random opponent and against the previous check's policy (rock-paper-scissors scores 0
against uniform random whatever the policy does; against a fixed earlier policy it does not)."""
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pettingzoo.classic import leduc_holdem_v4, rps_v2
from rich.console import Console

from packrl.emulation import emulate
from packrl.models import Policy
from packrl.train.dashboard import Dashboard
from packrl.train.versus import PreviousPolicy, is_two_player_zero_sum, match_stats, training_check, versus

ROCK, PAPER, SCISSORS = 0, 1, 2


def always(move: int) -> Policy:
    """A policy for rock-paper-scissors that plays ``move`` (its logits: 0 everywhere, 60 on ``move``)."""
    env = emulate(rps_v2.env())
    policy = Policy.from_env(env, hidden=8)
    env.close()
    with torch.no_grad():
        head = policy.decoder.actor.discrete
        head.weight.zero_()
        head.bias.fill_(0.0)
        head.bias[move] = 60.0
    return policy


@given(st.lists(st.integers(-13, 13).map(float), min_size=1, max_size=200))
def test_match_stats_are_the_rates_the_mean_and_a_95_percent_interval(rewards):
    stats = match_stats(np.array(rewards))
    assert stats["games"] == len(rewards)
    assert stats["win"] + stats["draw"] + stats["loss"] == pytest.approx(1.0)
    assert stats["win"] == pytest.approx(sum(r > 0 for r in rewards) / len(rewards))
    assert stats["reward"] == pytest.approx(statistics.fmean(rewards))
    expected = 1.959964 * statistics.stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else 0.0
    assert stats["reward_ci95"] == pytest.approx(expected, rel=1e-5, abs=1e-12)


def test_rock_paper_scissors_scores_against_a_policy_what_random_cannot_show():
    """Rock against scissors wins each of the 15 rounds of every game, in both seats: +15 per game, interval 0.
    Against uniform random, rock's mean reward is near 0 (the interval covers it)."""
    assert is_two_player_zero_sum("pettingzoo.classic.rps_v2")
    rock, scissors, paper = always(ROCK), always(SCISSORS), always(PAPER)
    beat = versus(rock, scissors, rps_v2.env, games=6, seed=1)
    assert beat == {"win": 1.0, "draw": 0.0, "loss": 0.0, "reward": 15.0, "reward_ci95": 0.0, "games": 6}
    lost = versus(rock, paper, rps_v2.env, games=6, seed=1)
    assert lost["loss"] == 1.0 and lost["reward"] == -15.0
    random = versus(rock, None, rps_v2.env, games=40, seed=1)
    assert abs(random["reward"]) <= random["reward_ci95"] * 1.5 + 1e-9 and random["reward_ci95"] > 0


def test_a_training_check_plays_the_previous_checks_policy_from_the_second_check():
    rock = always(ROCK)
    check = training_check(rps_v2.env, games=4, seed=0)
    first = check(rock, 10)
    assert set(first) == {f"vs_random/{k}" for k in ("win", "draw", "loss", "reward", "reward_ci95")}
    with torch.no_grad():  # the policy changes after the check: now it plays paper, and beats its old self
        rock.decoder.actor.discrete.bias.copy_(always(PAPER).decoder.actor.discrete.bias)
    second = check(rock, 20)
    assert second["vs_previous/reward"] == 15.0 and second["vs_previous/win"] == 1.0
    assert check(rock, 30)["vs_previous/reward"] == 0.0  # paper against the paper copied at the second check


def test_previous_policy_is_a_copy_not_the_training_policy():
    policy = always(ROCK)
    previous = PreviousPolicy()
    assert previous.swap(policy) is None
    with torch.no_grad():
        policy.decoder.actor.discrete.bias.zero_()
    copy = previous.swap(policy)
    assert copy is not policy and float(copy.decoder.actor.discrete.bias[ROCK]) == 60.0


def test_leduc_chips_per_game_and_the_dashboard_rows():
    """Leduc hold'em against random: the mean reward per game is the mean of the seats' chip totals, the
    interval is finite, and the dashboard shows both matches' rows."""
    env = emulate(leduc_holdem_v4.env())
    policy = Policy.from_env(env, hidden=16)
    env.close()
    stats = versus(policy, None, leduc_holdem_v4.env, games=30, seed=5)
    assert stats["games"] == 30 and np.isfinite(stats["reward"]) and stats["reward_ci95"] > 0
    assert stats == versus(policy, None, leduc_holdem_v4.env, games=30, seed=5)  # seeded: the same games
    board = Dashboard("leduc", 100, live=False, console=Console(record=True, width=100), versus=True)
    board.update({"global_step": 10, "iteration": 1, **{f"vs_random/{k}": v for k, v in stats.items() if k != "games"}})
    console = Console(record=True, width=100)
    console.print(board.table())
    text = console.export_text()
    assert "vs random: reward per game" in text and f"{stats['reward']:+.3f}" in text
    assert "vs previous: win / draw / loss" in text
