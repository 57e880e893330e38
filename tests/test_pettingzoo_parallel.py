"""Parallel emulation on real PettingZoo envs, side by side with the raw env under the same seed and
actions: KAZ (agents die mid-episode), pursuit (truncation), MPE2 and MAgent2 (agents whose
observation and action spaces differ by role)."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from magent2.environments import adversarial_pursuit_v4, tiger_deer_v4
from mpe2 import simple_adversary_v3, simple_tag_v3
from pettingzoo.butterfly import knights_archers_zombies_v11
from pettingzoo.sisl import pursuit_v5
from test_pettingzoo_aec import assert_same_leaves, row_leaves

from packrl import EmulationError
from packrl.emulation import emulate
from packrl.nativize import nativize
from packrl.vector import make as make_vector

JUNK = -7  # written into rows whose agent does not act: the wrapper must not read them


def native_action(space: spaces.Space, rng: np.random.Generator):
    if isinstance(space, spaces.Discrete):
        return int(space.start + rng.integers(space.n))
    return rng.uniform(space.low, space.high).astype(space.dtype)


def batch_actions(wrapped, native: dict) -> list:
    """Policy-facing actions, one per row: the native action encoded, junk in rows that do not act."""
    rows = []
    for row, agent in enumerate(wrapped.possible_agents):
        action = wrapped.emulated.action_for(row)
        if agent in native:
            rows.append(action.encode(native[agent]))
        else:
            rows.append(JUNK if action.kind == "discrete" else np.full(action.num_continuous, np.nan))
    return rows


def check_rows(wrapped, raw, obs: dict, rewards: dict, terminations: dict, truncations: dict) -> int:
    """The wrapper's buffers equal the raw env's step (or reset) output; returns how many agents ended."""
    seen, ended = set(), 0
    for agent, value in obs.items():
        row = wrapped.emulated.row_of(agent)
        seen.add(row)
        terminated, truncated = terminations.get(agent, False), truncations.get(agent, False)
        assert wrapped.terminals[row] == terminated and wrapped.truncations[row] == truncated, agent
        assert wrapped.rewards[row] == np.float32(rewards.get(agent, 0.0)), agent
        if terminated or truncated:
            ended += 1
            assert not wrapped.masks[row] and not wrapped.observations[row].any(), agent
            assert_same_leaves(row_leaves(wrapped, wrapped.final_observations, agent), value, f"final {agent}")
        else:
            assert wrapped.masks[row], agent
            assert_same_leaves(row_leaves(wrapped, wrapped.observations, agent), value, agent)
    others = [r for r in range(wrapped.num_agents) if r not in seen]
    assert not wrapped.masks[others].any() and not wrapped.observations[others].any()
    assert not wrapped.rewards[others].any() and not wrapped.terminals[others].any()
    assert wrapped.done == (not raw.agents)
    return ended


def run_side_by_side(make, seed: int) -> dict:
    """One full episode on the raw env and through the wrapper; returns what happened."""
    raw, wrapped = make(), emulate(make())
    obs, _ = raw.reset(seed=seed)
    wrapped.reset(seed=seed)
    check_rows(wrapped, raw, obs, {}, {}, {})
    rng = np.random.default_rng(seed)
    totals = {a: 0.0 for a in raw.possible_agents}
    steps = mid_episode_ends = ends = 0
    while raw.agents:
        native = {a: native_action(raw.action_space(a), rng) for a in raw.agents}
        policy = batch_actions(wrapped, native)
        obs, rewards, terminations, truncations, _ = raw.step(native)
        wrapped.step(policy)
        ended = check_rows(wrapped, raw, obs, rewards, terminations, truncations)
        ends += ended
        mid_episode_ends += bool(ended and raw.agents)
        steps += 1
        for agent, reward in rewards.items():
            totals[agent] += reward
    assert wrapped.done
    return {"steps": steps, "ends": ends, "mid_episode_ends": mid_episode_ends, "totals": totals,
            "wrapped": wrapped}


def test_kaz_agents_die_mid_episode_rows_masked_and_zero():
    result = run_side_by_side(knights_archers_zombies_v11.parallel_env, seed=2)
    assert result["mid_episode_ends"] >= 1, "seed 2 kills an agent while the others play on"
    assert result["ends"] == 4, "every agent's end is reported exactly once"
    assert result["wrapped"].passthrough  # one group of float64 Box observations: rows are the Box


def test_pursuit_ends_by_truncation_for_every_pursuer():
    result = run_side_by_side(lambda: pursuit_v5.parallel_env(max_cycles=15), seed=0)
    wrapped = result["wrapped"]
    assert result["steps"] == 15 and result["ends"] == 8
    assert wrapped.truncations.all() and not wrapped.terminals.any()


@pytest.mark.parametrize("make, roles", [
    (simple_adversary_v3.parallel_env, {"adversary": (8,), "agent": (10,)}),
    (simple_tag_v3.parallel_env, {"adversary": (16,), "agent": (14,)}),
    (lambda: simple_tag_v3.parallel_env(continuous_actions=True), {"adversary": (16,), "agent": (14,)}),
])
def test_mpe_roles_keep_their_own_layouts(make, roles):
    result = run_side_by_side(make, seed=1)
    wrapped = result["wrapped"]
    emulated = wrapped.emulated
    assert emulated.heterogeneous and len(emulated.groups) == 2
    for group in emulated.groups:
        role = group.agents[0].split("_")[0]
        assert all(a.startswith(role) for a in group.agents)
        assert group.observation.space.shape == roles[role]
        assert [emulated.row_group[r] for r in group.rows] == [group.index] * len(group.rows)
    assert wrapped.single_observation_space.shape == (emulated.nbytes,)
    assert emulated.nbytes == max(g.observation.nbytes for g in emulated.groups)
    assert result["ends"] == wrapped.num_agents  # everyone is truncated at max_cycles


def test_mpe_group_rows_nativize_per_group():
    """A policy built per group reads its rows through emulated.rows_for + nativize."""
    wrapped = emulate(simple_adversary_v3.parallel_env())
    raw = simple_adversary_v3.parallel_env()
    raw_obs, _ = raw.reset(seed=5)
    wrapped.reset(seed=5)
    for group in wrapped.emulated.groups:
        leaves = nativize(wrapped.emulated.rows_for(wrapped.observations, group), group.observation)
        assert leaves.shape == (len(group.rows), *group.observation.space.shape)
        for k, agent in enumerate(group.agents):
            assert leaves[k].tobytes() == raw_obs[agent].tobytes()
        batched = np.stack([wrapped.observations] * 3)  # (time, agents, nbytes) works the same
        assert nativize(wrapped.emulated.rows_for(batched, group), group.observation).shape[:2] == (3, len(group.rows))


def test_magent_teams_receive_every_one_of_their_own_actions():
    """Predators have 13 actions and prey 9: the shared action space is Discrete(13), each agent's
    whole range goes through, and a choice beyond an agent's own range is refused by name."""
    make = lambda: adversarial_pursuit_v4.parallel_env(map_size=15, max_cycles=30)  # noqa: E731
    raw, wrapped = make(), emulate(make())
    raw.reset(seed=0)
    wrapped.reset(seed=0)
    assert wrapped.single_action_space == spaces.Discrete(13)
    sizes = {g.agents[0].split("_")[0]: int(g.action.nvec[0]) for g in wrapped.emulated.groups}
    assert sizes == {"predator": 13, "prey": 9}
    for choice in range(13):
        native = {a: min(choice, raw.action_space(a).n - 1) for a in raw.agents}
        obs, rewards, terminations, truncations, _ = raw.step(native)
        wrapped.step(batch_actions(wrapped, native))
        check_rows(wrapped, raw, obs, rewards, terminations, truncations)
    prey = next(a for a in raw.agents if a.startswith("prey"))
    bad = batch_actions(wrapped, {a: 0 for a in raw.agents})
    bad[wrapped.emulated.row_of(prey)] = 9
    with pytest.raises(EmulationError, match=f"action 9 for agent '{prey}' is outside its Discrete\\(9\\)"):
        wrapped.step(bad)


def test_magent_tiger_deer_side_by_side():
    """Deer (3x3 view, 5 actions) and tigers (9x9 view, 9 actions): two groups, rows of the
    widest layout, every agent's truncation reported once at max_cycles."""
    result = run_side_by_side(lambda: tiger_deer_v4.parallel_env(map_size=15, max_cycles=60), seed=3)
    wrapped = result["wrapped"]
    assert [(g.agents[0], len(g.agents)) for g in wrapped.emulated.groups] == [("deer_0", 11), ("tiger_0", 2)]
    assert result["steps"] == 60 and result["ends"] == wrapped.num_agents and wrapped.truncations.all()


def test_bad_parallel_actions_name_the_agent():
    wrapped = emulate(knights_archers_zombies_v11.parallel_env())
    wrapped.reset(seed=2)
    with pytest.raises(EmulationError, match="has 3 rows \\(shape \\(3,\\)\\), expected 4"):
        wrapped.step(np.zeros(3, np.int64))
    with pytest.raises(EmulationError, match="action 6 for agent 'knight_0'"):
        wrapped.step(np.array([0, 0, 6, 0]))
    with pytest.raises(EmulationError, match="no action given for agent\\(s\\) \\['knight_1'\\]"):
        wrapped.step({"archer_0": 0, "archer_1": 0, "knight_0": 0})
    rng = np.random.default_rng(2)
    while wrapped.masks.all():  # play until an agent has died
        wrapped.step(rng.integers(6, size=4))
    dead = wrapped.possible_agents[int(np.flatnonzero(~wrapped.masks)[0])]
    actions = {a: 0 for a in wrapped.possible_agents}
    with pytest.raises(EmulationError, match=f"action given for agent '{dead}', which is not alive"):
        wrapped.step(actions)


def test_vector_backend_resets_a_finished_pettingzoo_episode_in_the_same_step():
    vec = make_vector(lambda: pursuit_v5.parallel_env(max_cycles=5), 2, backend="serial")
    vec.reset(seed=0)
    for _ in range(4):
        _, _, terminals, truncations, _ = vec.step(np.zeros(16, np.int64))
        assert not truncations.any() and vec.masks.all()
    obs, rewards, terminals, truncations, _ = vec.step(np.zeros(16, np.int64))
    assert truncations.all() and not terminals.any()
    assert vec.masks.all(), "the next episode's first observations are in place"
    assert obs.any() and vec.final_observations.any()
    vec.close()


def test_torch_actions_are_taken_like_numpy_ones():
    import torch

    env = emulate(pursuit_v5.parallel_env(max_cycles=20))
    twin = emulate(pursuit_v5.parallel_env(max_cycles=20))
    env.reset(seed=3)
    twin.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(10):
        actions = rng.integers(0, 5, env.num_agents)
        env.step(torch.from_numpy(actions))
        twin.step(actions)
        np.testing.assert_array_equal(env.observations, twin.observations)
    act = env.emulated.action_for(0)
    assert act.decode(torch.tensor(3)) == act.decode(np.int64(3))


def test_rows_wider_than_a_groups_layout_point_to_rows_for():
    import torch

    from packrl import NativizeError
    from packrl.nativize import nativize

    env = emulate(simple_adversary_v3.parallel_env())
    env.reset(seed=0)
    layout = env.emulated.observation
    with pytest.raises(NativizeError, match="rows_for"):
        nativize(torch.from_numpy(env.observations), layout)
    with pytest.raises(EmulationError, match="rows_for"):
        layout.unpack(env.observations)
    group = env.emulated.groups[0]
    views = nativize(torch.from_numpy(env.emulated.rows_for(env.observations, group)), group.observation)
    assert views.shape[0] == len(group.rows)
