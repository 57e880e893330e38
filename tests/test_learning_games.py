"""Two-player games learn with `packrl train`'s defaults (the pettingzoo-classic preset, self-play), judged
against a uniformly random legal opponent (packrl.train.versus), bounded by agent steps.

benchmarks/learning.py --tasks connect_four,tictactoe measures the same runs over seeds to the issue's
thresholds (connect four win >= 0.9, tictactoe win + draw >= 0.9)."""
import pytest
from pettingzoo.classic import connect_four_v3

from packrl import config as settings
from packrl.train.run import build_ppo
from packrl.train.versus import versus_random

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.slow
def test_connect_four_defaults_beat_a_random_opponent():
    """Untrained, the greedy policy wins about half its games against random play; after 100k agent steps of
    self-play with the defaults it must win at least 0.8 of 200 (seats alternating)."""
    config, preset = settings.resolve(flags={"env": {"id": "pettingzoo.classic.connect_four_v3"},
                                             "train": {"seed": 0, "total_steps": 100_000}})
    assert preset.name == "pettingzoo-classic"
    ppo = build_ppo(config)
    before = versus_random(ppo.policy, connect_four_v3.env, games=200, seed=123, greedy=True)
    ppo.train(100_000)
    ppo.env.close()
    after = versus_random(ppo.policy, connect_four_v3.env, games=200, seed=123, greedy=True)
    assert before["win"] < 0.8, before
    assert after["win"] >= 0.8, (before, after)
