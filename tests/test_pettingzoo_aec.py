"""AEC emulation on real PettingZoo games, side by side with the raw env under the same seed and moves.

The raw env is driven by PettingZoo's own loop (``agent_iter`` / ``last()`` / ``step(None)`` for
ended agents); every turn it shows must appear in the wrapper's rows: the acting agent's
observation (bit-equal) and reward on the acting row, every ended agent's final observation,
reward and end flag on its row, zeros and masks everywhere else.
"""
from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.butterfly import knights_archers_zombies_v11
from pettingzoo.classic import chess_v6, connect_four_v3, tictactoe_v3

from packrl import EmulationError
from packrl.emulation import emulate
from packrl.nativize import nativize


def assert_same_leaves(unpacked, raw, where: str) -> None:
    """Every leaf of ``raw`` equals the unpacked view bit for bit, in the view's (the space's) dtype."""
    if isinstance(raw, dict):
        assert set(unpacked) == set(raw), where
        for key in raw:
            assert_same_leaves(unpacked[key], raw[key], f"{where}[{key!r}]")
        return
    raw = np.asarray(raw)
    view = np.asarray(unpacked)
    assert view.shape == raw.shape, where
    if raw.dtype == view.dtype:
        assert view.tobytes() == raw.tobytes(), where
    else:
        assert np.array_equal(view, raw), where


def row_leaves(wrapped, buf: np.ndarray, agent):
    """One agent's row as its space's leaves (a pass-through Box row is the Box itself)."""
    row = wrapped.emulated.row_of(agent)
    if wrapped.passthrough:
        return buf[row]
    layout = wrapped.emulated.observation_for(agent)
    return nativize(buf[row, : layout.nbytes], layout)


def raw_until_live_turn(env):
    """PettingZoo's loop up to the next agent that must act: the ended agents' turns (stepped with
    None) and the live turn, each as (agent, observation, reward, terminated, truncated)."""
    ended = []
    while env.agents:
        agent = env.agent_selection
        obs, reward, terminated, truncated, _ = env.last()
        if terminated or truncated:
            ended.append((agent, obs, reward, terminated, truncated))
            env.step(None)
            continue
        return ended, (agent, obs, reward)
    return ended, None


def check_turns(wrapped, ended, live, totals) -> None:
    """The wrapper's buffers after one step hold exactly the raw turns ``ended`` and ``live``."""
    rows_seen = set()
    for agent, obs, reward, terminated, truncated in ended:
        row = wrapped.emulated.row_of(agent)
        assert wrapped.terminals[row] == terminated and wrapped.truncations[row] == truncated
        assert not wrapped.masks[row]
        assert wrapped.rewards[row] == np.float32(reward)
        assert_same_leaves(row_leaves(wrapped, wrapped.final_observations, agent), obs, f"final observation of {agent}")
        assert not wrapped.observations[row].any(), f"row of ended agent {agent} must be zeros"
        totals[agent] += wrapped.rewards[row]
        rows_seen.add(row)
    if live is None:
        assert wrapped.done and not wrapped.masks.any()
    else:
        agent, obs, reward = live
        row = wrapped.emulated.row_of(agent)
        assert not wrapped.done and wrapped.acting_agent == agent
        assert np.flatnonzero(wrapped.masks).tolist() == [row], "only the acting agent is unmasked"
        assert not wrapped.terminals[row] and not wrapped.truncations[row]
        assert wrapped.rewards[row] == np.float32(reward)
        assert_same_leaves(row_leaves(wrapped, wrapped.observations, agent), obs, f"observation of {agent}")
        totals[agent] += wrapped.rewards[row]
        rows_seen.add(row)
    others = [r for r in range(wrapped.num_agents) if r not in rows_seen]
    assert not wrapped.rewards[others].any() and not wrapped.terminals[others].any()
    assert not wrapped.truncations[others].any() and not wrapped.observations[others].any()


def play_side_by_side(make, seed: int, choose, max_turns: int = 10_000) -> tuple[dict, dict, int, int, object]:
    """Play one game on the raw env and through the wrapper with the same seed and moves. Returns
    both reward totals per agent, the number of turns, of turns after which an agent ended while
    the game went on, and the wrapped env."""
    raw, wrapped = make(), emulate(make())
    raw.reset(seed=seed)
    wrapped.reset(seed=seed)
    rng, junk = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    raw_totals = {a: 0.0 for a in raw.possible_agents}
    wrapped_totals = {a: 0.0 for a in raw.possible_agents}
    ended, live = raw_until_live_turn(raw)
    check_turns(wrapped, ended, live, wrapped_totals)
    turns = deaths_mid_game = 0
    while live is not None and turns < max_turns:
        for agent, _, reward, _, _ in ended:
            raw_totals[agent] += reward
        agent, obs, reward = live
        raw_totals[agent] += reward
        move = choose(obs, raw.action_space(agent), rng)
        # every other row holds a junk action: only the acting agent's row may be read
        actions = junk.integers(0, 2**31, size=wrapped.num_agents)
        actions[wrapped.emulated.row_of(agent)] = move
        raw.step(move)
        wrapped.step(actions)
        ended, live = raw_until_live_turn(raw)
        check_turns(wrapped, ended, live, wrapped_totals)
        turns += 1
        deaths_mid_game += bool(ended and live is not None)
    for agent, _, reward, _, _ in ended:
        raw_totals[agent] += reward
    assert live is None and wrapped.done, "the game must be played to its end"
    return raw_totals, wrapped_totals, turns, deaths_mid_game, wrapped


def legal_move(obs, space, rng) -> int:
    return int(rng.choice(np.flatnonzero(obs["action_mask"])))


@pytest.mark.parametrize("make, seeds", [
    (connect_four_v3.env, range(4)),
    (tictactoe_v3.env, range(4)),
    (chess_v6.env, [4]),  # a 157-move game: chess turns cost ~10 ms
])
def test_classic_games_match_the_raw_env_turn_by_turn(make, seeds):
    for seed in seeds:
        raw_totals, wrapped_totals, turns, _, _ = play_side_by_side(make, seed, legal_move)
        assert turns > 4
        assert wrapped_totals == pytest.approx(raw_totals, abs=0)
        assert sum(wrapped_totals.values()) == sum(raw_totals.values())


def test_game_end_reaches_both_players_with_final_rewards():
    """A won connect-four game: winner +1 and loser -1 on the same step, both terminated."""
    wrapped = emulate(connect_four_v3.env())
    wrapped.reset(seed=0)
    for column in [0, 1, 0, 1, 0, 1]:
        wrapped.step(np.full(2, column))
        assert not wrapped.done and wrapped.rewards.tolist() == [0.0, 0.0]
    wrapped.step(np.full(2, 0))  # player_0 completes the column
    assert wrapped.done
    assert wrapped.rewards.tolist() == [1.0, -1.0]
    assert wrapped.terminals.tolist() == [True, True] and not wrapped.masks.any()
    with pytest.raises(EmulationError, match="call reset"):
        wrapped.step(np.zeros(2, np.int64))


def test_action_mask_leaf_is_exposed_to_heads():
    wrapped = emulate(chess_v6.env())
    group = wrapped.emulated.groups[0]
    assert group.action_mask == ("action_mask",) and wrapped.emulated.action_mask == ("action_mask",)
    wrapped.reset(seed=3)
    row = int(np.flatnonzero(wrapped.masks)[0])
    mask = nativize(wrapped.observations[row], group.observation)["action_mask"]
    assert mask.shape == (wrapped.single_action_space.n,) and mask.sum() == 20  # white's 20 opening moves
    renamed = emulate(tictactoe_v3.env(), action_mask_key="observation_is_not_a_mask")
    assert renamed.emulated.action_mask is None
    with pytest.raises(EmulationError, match="'observation' has 18 entries but the action space has 9"):
        emulate(tictactoe_v3.env(), action_mask_key="observation")


def test_bad_actions_name_the_agent():
    wrapped = emulate(tictactoe_v3.env())
    wrapped.reset(seed=0)
    assert wrapped.acting_agent == "player_1"
    with pytest.raises(EmulationError, match="'player_2', which is not the acting agent"):
        wrapped.step({"player_2": 3})
    with pytest.raises(EmulationError, match="'ghost', which is not in possible_agents"):
        wrapped.step({"ghost": 3})
    with pytest.raises(EmulationError, match="has 3 rows .* expected 2"):
        wrapped.step(np.zeros(3, np.int64))
    with pytest.raises(EmulationError, match="action 9 for agent 'player_1' is outside its Discrete\\(9\\)"):
        wrapped.step(np.array([9, 0]))
    with pytest.raises(EmulationError, match="agent 'player_1'"):
        wrapped.step(np.array([-1, 0]))
    with pytest.raises(EmulationError, match="no action given for agent\\(s\\) \\['player_1'\\]"):
        wrapped.step({})
    wrapped.step({"player_1": 4})  # the dict form, strict and accepted
    assert wrapped.acting_agent == "player_2"


def kaz_move(obs, space, rng) -> int:
    return int(rng.integers(space.n))


def test_kaz_as_aec_agents_die_mid_game_and_rewards_accumulate_per_agent():
    """KAZ played turn by turn: agents die while others play on, and every reward (including those
    given to an agent between its turns) reaches it exactly as PettingZoo's last() shows it."""
    raw_totals, wrapped_totals, turns, deaths_mid_game, _ = play_side_by_side(knights_archers_zombies_v11.env, 2, kaz_move)
    assert wrapped_totals == raw_totals and turns > 100
    assert deaths_mid_game >= 1


def test_kaz_aec_reports_a_mid_game_death_once():
    wrapped = emulate(knights_archers_zombies_v11.env())
    wrapped.reset(seed=2)
    rng = np.random.default_rng(2)
    ends = np.zeros(wrapped.num_agents, int)
    mid_game = False
    while not wrapped.done:
        wrapped.step(rng.integers(6, size=wrapped.num_agents))
        ended = wrapped.terminals | wrapped.truncations
        ends += ended
        mid_game |= bool(ended.any() and not wrapped.done)
        assert not (ended & wrapped.masks).any()
    assert mid_game, "seed 2 kills an agent before the game ends"
    assert ends.tolist() == [1, 1, 1, 1], "each agent's end is reported exactly once"


def test_kaz_as_aec_truncation_reaches_every_agent():
    raw_totals, wrapped_totals, turns, _, wrapped = play_side_by_side(
        lambda: knights_archers_zombies_v11.env(max_cycles=20), 1, kaz_move)
    assert wrapped_totals == raw_totals and turns == 4 * 20
    assert wrapped.truncations.all() and not wrapped.terminals.any()
