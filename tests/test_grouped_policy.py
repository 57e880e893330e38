"""GroupedPolicy: one Policy per agent group (simple_tag's predators and prey observe 16 and 14 floats), its logits
and values in row order whatever order the rows come in, and PPO over it: values, bootstrap values of truncated
rows, observation statistics and updates each reaching the right group's policy."""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from pettingzoo import ParallelEnv

from packrl import vector
from packrl.errors import EmulationError
from packrl.hyperparameters import PPOConfig
from packrl.models import GroupedPolicy, Policy
from packrl.train.ppo import PPO

NUM_ENVS = 4
AGENTS = 4  # adversary_0..2 (group 0), agent_0 (group 1)


@pytest.fixture(scope="module")
def tag():
    env = vector.make("simple_tag", NUM_ENVS, backend="numba", seed=0)
    yield env
    env.close()


@pytest.fixture(scope="module")
def policy_and_rows(tag):
    torch.manual_seed(0)
    policy = GroupedPolicy.from_env(tag, hidden=16)
    obs, _ = tag.reset(seed=3)
    return policy, torch.as_tensor(obs.copy())


def test_each_row_is_read_by_its_own_groups_policy(tag, policy_and_rows):
    policy, x = policy_and_rows
    logits, values, state = policy.forward_eval(x)
    assert state == () and logits.shape == (NUM_ENVS * AGENTS, 5) and values.shape == (NUM_ENVS * AGENTS,)
    for row in range(x.shape[0]):
        own = policy.groups[tag.emulated.row_group[row % AGENTS]]
        own_logits, own_value, _ = own.forward_eval(x[row: row + 1])
        torch.testing.assert_close(logits[row], own_logits[0])
        torch.testing.assert_close(values[row], own_value[0])


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_rows_in_any_order_and_any_subset_get_their_groups_outputs(policy_and_rows, data):
    policy, x = policy_and_rows
    n = x.shape[0]
    rows = torch.as_tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2 * n)), dtype=torch.long)
    logits, values, _ = policy.forward_eval(x)
    picked_logits, picked_values, _ = policy.forward_eval(x[rows], rows=rows)
    torch.testing.assert_close(picked_logits, logits[rows])
    torch.testing.assert_close(picked_values, values[rows])
    horizon = data.draw(st.integers(1, 3))  # training segments: (B, T) rows, constant along T
    seq_logits, seq_values, _ = policy.forward(x[rows][:, None].expand(-1, horizon, -1),
                                               rows=rows[:, None].expand(-1, horizon))
    torch.testing.assert_close(seq_logits, logits[rows][:, None].expand(-1, horizon, -1))
    torch.testing.assert_close(seq_values, values[rows][:, None].expand(-1, horizon))


def _marked(tag, hidden=16, **settings):
    """A GroupedPolicy whose critics say which group they are: value -100 for predators, +100 for the prey."""
    torch.manual_seed(1)
    policy = GroupedPolicy.from_env(tag, hidden=hidden, **settings)
    with torch.no_grad():
        for g, value in enumerate((-100.0, 100.0)):
            critic = policy.groups[g].decoder.critic
            for p in critic.parameters():
                p.zero_()
            list(critic.parameters())[-1].fill_(value)
    return policy


def test_ppo_values_and_truncation_bootstraps_reach_each_rows_group():
    """simple_tag truncates every copy at 25 cycles: a 32-step rollout holds each row's truncation, whose final
    observation is valued by the row's own group (shuffled into one batch with the next observations)."""
    env = vector.make("simple_tag", NUM_ENVS, backend="numba", seed=0)
    try:
        ppo = PPO(env, _marked(env), PPOConfig(num_steps=32, seed=0, normalize_rewards=False))
        ppo.collect()
        expected = torch.tensor([(-100.0, 100.0)[env.emulated.row_group[r % AGENTS]] for r in range(NUM_ENVS * AGENTS)])
        torch.testing.assert_close(ppo.values, expected.expand(32, -1))
        torch.testing.assert_close(ppo.next_value, expected)
        truncated = ppo.truncations
        assert int(truncated.sum()) == NUM_ENVS * AGENTS  # one truncation per row
        torch.testing.assert_close(ppo.final_values[truncated], expected.expand(32, -1)[truncated])
        assert bool((ppo.final_values[~truncated] == 0).all())
    finally:
        env.close()


class Staggered(ParallelEnv):
    """Two groups with one agent each: "scout" (2 floats) is truncated alone after 3 steps, "base" (3 floats) at 5,
    so a truncation holds part of a copy's rows and each final observation must be told its row."""

    metadata = {"name": "staggered_groups"}
    possible_agents = ["base", "scout"]

    def observation_space(self, agent):
        return spaces.Box(-1, 1, (3 if agent == "base" else 2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def _obs(self, agent):
        return np.full(self.observation_space(agent).shape, self.t / 10, np.float32)

    def step(self, actions):
        self.t += 1
        cut = {a: self.t == (3 if a == "scout" else 5) for a in self.agents}
        out = ({a: self._obs(a) for a in self.agents}, {a: 1.0 for a in self.agents},
               {a: False for a in self.agents}, cut, {a: {} for a in self.agents})
        self.agents = [a for a in self.agents if not cut[a]]
        return out


def test_a_truncation_of_part_of_a_copy_is_bootstrapped_by_its_own_group():
    env = vector.make(Staggered, 3, backend="serial", seed=0)
    try:
        assert [g.agents for g in env.emulated.groups] == [("base",), ("scout",)]
        ppo = PPO(env, _marked(env), PPOConfig(num_steps=8, seed=0, normalize_rewards=False))
        ppo.collect()
        truncated = ppo.truncations
        rows = torch.arange(6).expand(8, -1)
        assert set(rows[truncated].tolist()) == {0, 1, 2, 3, 4, 5}
        assert set(torch.nonzero(truncated)[:, 0].tolist()) >= {2, 4}  # the scouts' step apart from the bases'
        expected = torch.where(rows % 2 == 0, -100.0, 100.0)
        torch.testing.assert_close(ppo.final_values[truncated], expected[truncated])
    finally:
        env.close()


def test_shuffled_minibatches_score_each_row_with_its_own_groups_policy():
    """With learning rate 0 the policy never moves, so every minibatch's ratio is exactly 1 where each shuffled row is
    read by the policy that acted for it: approx_kl and clipfrac 0."""
    env = vector.make("simple_tag", NUM_ENVS, backend="numba", seed=0)
    try:
        torch.manual_seed(3)
        ppo = PPO(env, GroupedPolicy.from_env(env, hidden=16), PPOConfig(num_steps=16, num_minibatches=4,
                                                                         update_epochs=2, learning_rate=0.0, seed=0))
        ppo.collect()
        stats = ppo.update()
        assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7) and stats["clipfrac"] == 0.0, stats
    finally:
        env.close()


def test_ppo_updates_both_groups_in_shuffled_minibatches_and_each_normalizes_its_own_rows():
    env = vector.make("simple_tag", NUM_ENVS, backend="numba", seed=0)
    try:
        torch.manual_seed(2)
        policy = GroupedPolicy.from_env(env, hidden=16, normalize_observations=True)
        before = [[p.detach().clone() for p in g.parameters()] for g in policy.groups]
        ppo = PPO(env, policy, PPOConfig(num_steps=16, num_minibatches=4, update_epochs=2, seed=0))
        ppo.collect()
        obs, masks = ppo.obs.clone(), ppo.train_masks.clone()
        stats = ppo.update()
        assert np.isfinite(stats["pg_loss"]) and np.isfinite(stats["v_loss"])
        for g, group in enumerate(policy.groups):
            assert any(not torch.equal(a, b) for a, b in zip(before[g], group.parameters())), f"group {g} unchanged"
            rows = [r for r in range(NUM_ENVS * AGENTS) if env.emulated.row_group[r % AGENTS] == g]
            own = obs[:, rows][masks[:, rows]][:, : env.emulated.groups[g].observation.nbytes]
            floats = own.view(torch.float32).double()
            encoder = group.encoder
            assert float(encoder.obs_count) == floats.shape[0]
            torch.testing.assert_close(encoder.obs_mean, floats.mean(0).to(encoder.obs_mean.dtype))
    finally:
        env.close()


def test_groups_must_share_an_action_space_and_be_stateless():
    from mpe2 import simple_world_comm_v3

    env = vector.make(lambda: simple_world_comm_v3.parallel_env(), 1, backend="serial", seed=0)
    try:
        with pytest.raises(EmulationError, match="needs one action space for every group"):
            GroupedPolicy.from_env(env)
    finally:
        env.close()
    tag = vector.make("simple_tag", 1, backend="numba", seed=0)
    try:
        recurrent = Policy.per_group(tag, network="gru", hidden=8)
        with pytest.raises(EmulationError, match="recurrent"):
            GroupedPolicy(list(recurrent), tag.emulated.row_group)
        with pytest.raises(EmulationError, match="must name each"):
            GroupedPolicy(list(Policy.per_group(tag, hidden=8)), (0, 0, 0, 0))
    finally:
        tag.close()
