"""PPO's update: CleanRL's target_kl rule, the optimizer and clipping through torch's public APIs, and the
update's statistics."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from packrl import vector
from packrl.models import Policy
from packrl.train.optimizer import TorchAdam, adam
from packrl.train.ppo import PPO, PPOConfig


def _optimizer_steps(target_kl):
    env = vector.make(lambda: gym.make("CartPole-v1"), 2, seed=0)
    torch.manual_seed(0)
    ppo = PPO(env, Policy.from_env(env, hidden=16),
              PPOConfig(num_steps=16, num_minibatches=2, update_epochs=4, learning_rate=1e-2, target_kl=target_kl))
    ppo.collect()
    stats = ppo.update()
    env.close()
    return ppo.optimizer.steps, stats


@pytest.mark.parametrize("target_kl, steps", [(None, 8), (1e9, 8), (0.0, 2)])
def test_target_kl_stops_after_the_epoch_whose_last_minibatch_exceeds_it(target_kl, steps):
    """CleanRL's rule: after each epoch, stop when the last minibatch's approx_kl exceeds target_kl. The
    first epoch's second minibatch runs on changed weights, so its approx_kl is above 0: target_kl 0 stops
    after one epoch (2 minibatch steps); None or a large target runs all 4 epochs (8 steps)."""
    taken, stats = _optimizer_steps(target_kl)
    assert taken == steps
    assert np.isfinite(stats["approx_kl"]) and stats["approx_kl"] >= 0.0


def test_the_fallback_adam_is_torch_adam_with_cleanrl_eps_and_clipping_is_clip_grad_norm():
    """Parameters of two dtypes get TorchAdam; its Adam and clipping equal torch's own calls, step by step."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=gen) for s in ((5, 3), (5,))] + [torch.randn((2, 5), generator=gen).double()]
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    ref = [torch.nn.Parameter(t.clone()) for t in start]
    opt_ours = adam(ours, lr=1e-2)
    assert isinstance(opt_ours, TorchAdam) and opt_ours.defaults["eps"] == 1e-5
    opt_ref = torch.optim.Adam(ref, lr=1e-2, eps=1e-5)
    for _ in range(4):
        grads = [10 * torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in ours]
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        norm = opt_ours.clip_grad_norm(0.5)
        want = torch.nn.utils.clip_grad_norm_(ref, 0.5)
        torch.testing.assert_close(norm, want.float())
        assert norm > 0.5  # the gradients were large: clipping acted
        opt_ours.step()
        opt_ref.step()
        for p, q in zip(ours, ref):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_advantages_normalized_once_per_update_give_the_step_of_normalizing_in_the_loss():
    """With the whole batch as the one minibatch, update() normalizes the advantages once (the waiting agents'
    masked rows left out) instead of in each epoch's loss. On a tictactoe rollout, its step equals one taken by
    hand through the loss's own per-minibatch normalization of the raw advantages."""
    from pettingzoo.classic import tictactoe_v3

    def rollout():
        env = vector.make(tictactoe_v3.env, 4, seed=0)
        torch.manual_seed(0)
        ppo = PPO(env, Policy.from_env(env, hidden=16), PPOConfig(num_steps=12, num_minibatches=1, update_epochs=1))
        ppo.collect()
        env.close()
        return ppo

    ours, by_hand = rollout(), rollout()
    assert not bool(ours.train_masks.all())  # some rows wait for their turn: the masked mean matters
    ours.update()
    advantages, returns = by_hand.advantages()
    b = by_hand._batch()
    b["advantages"], b["returns"] = by_hand._segments(advantages), by_hand._segments(returns)
    by_hand.optimizer.zero_grad()
    loss, _, _ = by_hand._minibatch_loss(b, slice(None), b["masks"], True)
    loss.backward()
    by_hand.optimizer.clip_grad_norm(by_hand.config.max_grad_norm)
    by_hand.optimizer.step()
    moved = False
    for p, q, start in zip(ours.policy.parameters(), by_hand.policy.parameters(), rollout().policy.parameters()):
        torch.testing.assert_close(p, q)
        moved |= not torch.equal(p, start)
    assert moved
