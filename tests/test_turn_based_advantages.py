"""Turn-based bootstrapping: each agent's advantages run over its own decisions, and an agent waiting for
its turn when the rollout ends never bootstraps from its zero (masked) row.

The reference below is written per agent, from the agent's list of decisions, in float64; it shares no
code with the kernels or with ``cut_pending_decisions``."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pettingzoo.classic import tictactoe_v3

from packrl import vector
from packrl.models import Policy
from packrl.train.advantage import compute_advantages, cut_pending_decisions
from packrl.train.ppo import PPO, PPOConfig

GAMMA, LAMBDA = 0.9, 0.8


def per_agent_reference(values, rewards, terminals, truncations, final_values, masks, next_value, next_masks):
    """(advantages, trained) in float64: for every row, its decisions d_0 < d_1 < ...; decision i collects the
    rewards of steps d_i .. (its episode's end, or d_{i+1} - 1) and bootstraps from V at d_{i+1}, from
    V(final observation) on truncation, from 0 on termination, or, after the rollout, from next_value when
    the row acts next. A last decision whose row waits after the rollout (and has not ended) is pending:
    not trained, and the decision before it bootstraps from V at the pending one."""
    T, N = values.shape
    adv = np.zeros((T, N))
    trained = np.zeros((T, N), bool)
    for n in range(N):
        decisions = [t for t in range(T) if masks[t, n]]
        deltas, cuts = [], []
        for i, d in enumerate(decisions):
            stop = decisions[i + 1] if i + 1 < len(decisions) else T
            ends = [t for t in range(d, stop) if terminals[t, n] or truncations[t, n]]
            if ends:
                e = ends[0]
                boot = 0.0 if terminals[e, n] else final_values[e, n]
                deltas.append(rewards[d:e + 1, n].sum() + GAMMA * boot - values[d, n])
                cuts.append(True)
            elif i + 1 < len(decisions):
                deltas.append(rewards[d:stop, n].sum() + GAMMA * values[stop, n] - values[d, n])
                cuts.append(False)
            elif next_masks[n]:
                deltas.append(rewards[d:T, n].sum() + GAMMA * next_value[n] - values[d, n])
                cuts.append(True)
            else:  # pending: its outcome comes after the rollout
                if deltas and not cuts[-1]:
                    prev = decisions[i - 1]
                    deltas[-1] = rewards[prev:d, n].sum() + GAMMA * values[d, n] - values[prev, n]
                    cuts[-1] = True
                decisions = decisions[:-1]
        following = 0.0
        for i in reversed(range(len(decisions))):
            following = deltas[i] + (0.0 if cuts[i] else GAMMA * LAMBDA * following)
            adv[decisions[i], n] = following
            trained[decisions[i], n] = True
    return adv, trained


def packrl_advantages(values, rewards, terminals, truncations, final_values, masks, next_value, next_masks):
    t = lambda a, dtype=torch.float32: torch.as_tensor(np.asarray(a), dtype=dtype)  # noqa: E731
    train_masks, train_rewards, boot = cut_pending_decisions(
        t(values), t(rewards), t(terminals, torch.bool), t(truncations, torch.bool), t(masks, torch.bool),
        t(next_value), t(next_masks, torch.bool))
    adv = compute_advantages(t(values), train_rewards, t(terminals, torch.bool), t(truncations, torch.bool),
                             t(final_values), boot, train_masks, GAMMA, LAMBDA)
    return adv.double().numpy(), train_masks.numpy()


def test_two_players_taking_turns_by_hand():
    """Rows 0 and 1 alternate (row 0 acts at even steps); the game ends (row 1 wins) at step 5, both agents
    are told at once; a new game starts at step 6 with row 0; after step 7 row 0 waits: its decision at
    step 6 is pending, and V(zero row) = 100 planted in next_value must reach nothing."""
    T = 8
    masks = np.zeros((T, 2), bool)
    masks[0::2, 0] = True
    masks[1::2, 1] = True
    values = np.arange(1, 2 * T + 1, dtype=np.float64).reshape(T, 2) / 10
    rewards = np.zeros((T, 2))
    terminals = np.zeros((T, 2), bool)
    rewards[5, 0], rewards[5, 1] = -1.0, 1.0  # row 1's move at 5 wins
    terminals[5] = True
    rewards[2, 1] = 0.25  # a reward delivered to row 1 while it waits (its decision at 1)
    final_values = np.zeros((T, 2))
    next_value = np.array([100.0, 7.0])  # row 0: V of its zero row (must not matter); row 1 acts next
    next_masks = np.array([False, True])
    adv, trained = packrl_advantages(values, rewards, terminals, np.zeros_like(terminals), final_values, masks,
                                     next_value, next_masks)
    ref, ref_trained = per_agent_reference(values, rewards, terminals, np.zeros_like(terminals), final_values, masks,
                                           next_value, next_masks)
    np.testing.assert_allclose(adv, ref, atol=1e-5)
    np.testing.assert_array_equal(trained, ref_trained)
    assert not trained[6, 0] and trained[7, 1]  # row 0's pending decision is left out; row 1's last is not
    # row 1's decision at 1: 0.25 arrives at step 2, bootstraps from its own next decision at step 3
    v = values
    a3 = 0.0 + GAMMA * v[5, 1] - v[3, 1] + GAMMA * LAMBDA * (1.0 - v[5, 1])
    assert abs(adv[1, 1] - (0.25 + GAMMA * v[3, 1] - v[1, 1] + GAMMA * LAMBDA * a3)) < 1e-5
    # nothing of row 0 depends on its zero row's value
    adv_other, _ = packrl_advantages(values, rewards, terminals, np.zeros_like(terminals), final_values, masks,
                                     np.array([-50.0, 7.0]), next_masks)
    np.testing.assert_array_equal(adv_other[:, 0], adv[:, 0])


@st.composite
def turn_based_rollouts(draw):
    """Random two- and three-player turn orders, ends on any step, rewards on any step, a random next mover."""
    T, players = draw(st.integers(1, 24)), draw(st.integers(1, 3))
    order = draw(st.lists(st.integers(0, players - 1), min_size=T, max_size=T))
    masks = np.zeros((T, players), bool)
    masks[np.arange(T), order] = True
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ends = rng.random((T, players)) < draw(st.sampled_from([0.0, 0.1, 0.3]))
    trunc = ends & (rng.random((T, players)) < 0.5)
    term = ends & ~trunc
    next_masks = np.zeros(players, bool)
    next_masks[draw(st.integers(0, players - 1))] = True
    return (rng.normal(size=(T, players)), rng.normal(size=(T, players)) * (rng.random((T, players)) < 0.5),
            term, trunc, rng.normal(size=(T, players)), masks, rng.normal(size=players), next_masks)


@settings(max_examples=300, deadline=None)
@given(turn_based_rollouts())
def test_random_turn_orders_match_the_per_agent_reference(rollout):
    adv, trained = packrl_advantages(*rollout)
    ref, ref_trained = per_agent_reference(*rollout)
    np.testing.assert_array_equal(trained, ref_trained)
    np.testing.assert_allclose(adv, ref, rtol=1e-4, atol=1e-4)


def test_single_agent_rollouts_are_unchanged():
    rng = np.random.default_rng(0)
    v, r = torch.tensor(rng.normal(size=(6, 3)), dtype=torch.float32), torch.tensor(rng.normal(size=(6, 3)), dtype=torch.float32)
    masks, ends, nv = torch.ones(6, 3, dtype=torch.bool), torch.zeros(6, 3, dtype=torch.bool), torch.ones(3)
    out = cut_pending_decisions(v, r, ends, ends, masks, nv, torch.ones(3, dtype=torch.bool))
    assert out[0] is masks and out[1] is r and out[2] is nv


def test_ppo_on_tictactoe_trains_each_agent_on_its_own_turns():
    """A real AEC rollout (tictactoe, 4 envs, 12 steps: games end and restart, an agent waits in each env):
    PPO's advantages equal the per-agent reference from its own storage, and no value of a waiting
    agent's zero row reaches them."""
    torch.manual_seed(0)
    env = vector.make(tictactoe_v3.env, 4, seed=0)
    ppo = PPO(env, Policy.from_env(env, hidden=32), PPOConfig(num_steps=12, gamma=GAMMA, gae_lambda=LAMBDA))
    ppo.collect()
    next_masks = ppo.storage.next_masks.numpy()
    assert not next_masks.all()  # some agent waits after the rollout
    adv, _ = ppo.advantages()
    ref, trained = per_agent_reference(ppo.values.double().numpy(), ppo.rewards.double().numpy(), ppo.terminals.numpy(),
                                       ppo.truncations.numpy(), ppo.final_values.double().numpy(), ppo.masks.numpy(),
                                       ppo.next_value.double().numpy(), next_masks)
    np.testing.assert_allclose(adv.double().numpy(), ref, atol=1e-5)
    np.testing.assert_array_equal(ppo.train_masks.numpy(), trained)
    assert (ppo.masks.numpy() & ~trained).any()  # a pending decision was left out
    ppo.next_value[~torch.from_numpy(next_masks)] = 1e6  # V(zero row) of the waiting agents
    ppo.train_masks, ppo.train_rewards, ppo.bootstrap_value = cut_pending_decisions(
        ppo.values, ppo.rewards, ppo.terminals, ppo.truncations, ppo.masks, ppo.next_value, ppo.storage.next_masks)
    np.testing.assert_allclose(ppo.advantages()[0].double().numpy(), ref, atol=1e-5)
    ppo.update()
    env.close()
