"""PPO: the truncation bootstrap, masked rows, recurrent segments, bf16, and data parallel over gloo."""
import os
import socket

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from packrl import vector
from packrl.models import Policy
from packrl.train.ppo import PPO, PPOConfig


class Alive(gym.Env):
    """+1 every step, never terminates, and the observation does not show the time: only the TimeLimit
    ends episodes, so the true value of every state is 1 / (1 - gamma)."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


def _alive_value(bootstrap_truncation: bool) -> float:
    env = vector.make(lambda: gym.wrappers.TimeLimit(Alive(), max_episode_steps=8), 4, seed=0)
    torch.manual_seed(0)
    policy = Policy.from_env(env, network="mlp", hidden=16)
    ppo = PPO(env, policy, PPOConfig(num_steps=16, learning_rate=1e-2, gamma=0.9, gae_lambda=0.95, clip_vloss=False,
                                     update_epochs=4, num_minibatches=1, anneal_lr=False,
                                     bootstrap_truncation=bootstrap_truncation, seed=0))
    ppo.train(16 * 4 * 60)
    with torch.no_grad():
        _, value, _ = policy.forward_eval(torch.as_tensor(env.observations), ())
    return float(value.mean())


def test_truncation_bootstraps_to_the_infinite_horizon_value():
    """gamma = 0.9: the value is 10 with the bootstrap; ORing truncation into done learns the average
    of (1 - 0.9^k) / 0.1 over the 8 steps of an episode, about 4.5."""
    right, wrong = _alive_value(True), _alive_value(False)
    assert abs(right - 10.0) < 1.0, right
    assert wrong < 6.0, wrong


def test_update_statistics_are_finite_and_masked_rows_are_excluded():
    env = vector.make(lambda: gym.make("CartPole-v1"), 2, seed=0)
    ppo = PPO(env, Policy.from_env(env, hidden=16), PPOConfig(num_steps=8, num_minibatches=2, update_epochs=1))
    ppo.collect()
    ppo.masks[:, 1] = False  # as if row 1 were a dead agent for the whole rollout
    ppo.rewards[:, 1] = float("nan")  # anything it carries must not reach the losses
    ppo.values[:, 1] = float("nan")
    stats = ppo.update()
    for key in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "explained_variance"):
        assert np.isfinite(stats[key]), (key, stats[key])
    assert all(torch.isfinite(p).all() for p in ppo.policy.parameters())


@pytest.mark.parametrize("network", ["lstm", "gru", "mingru"])
def test_recurrent_segments_reproduce_the_rollout_log_probs(network):
    """Before any update, the training forward over (segment, time) with resets at episode starts
    must give back the log-probs and values the rollout computed step by step."""
    env = vector.make(lambda: gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, 7), 3, seed=0)
    ppo = PPO(env, Policy.from_env(env, network=network, hidden=16), PPOConfig(num_steps=12, bptt_horizon=4))
    ppo.collect()
    assert ppo.starts[1:].any(), "episodes must end inside the rollout"
    b_states = tuple(torch.stack(p).reshape(-1, *p[0].shape[1:]) for p in zip(*ppo.segment_states))
    with torch.no_grad():
        logits, values, _ = ppo.policy.forward(ppo._segments(ppo.obs), b_states, ppo._segments(ppo.starts))
        logprobs = ppo.policy.decoder.distribution(logits).log_prob(ppo._segments(ppo.actions))
    torch.testing.assert_close(logprobs, ppo._segments(ppo.logprobs), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(values, ppo._segments(ppo.values), rtol=1e-4, atol=1e-4)
    stats = ppo.update()
    assert np.isfinite(stats["pg_loss"])


def test_bf16_autocast_trains():
    env = vector.make(lambda: gym.make("CartPole-v1"), 2, seed=0)
    ppo = PPO(env, Policy.from_env(env, hidden=16), PPOConfig(num_steps=8, bf16=True))
    before = [p.detach().clone() for p in ppo.policy.parameters()]
    history = ppo.train(32)
    assert np.isfinite(history[-1]["v_loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, ppo.policy.parameters()))


@pytest.mark.parametrize("answer, iterations", [(None, 4), (True, 4), (False, 1), (np.False_, 1), (np.True_, 4)])
def test_callback_stops_training_on_a_false_answer(answer, iterations):
    env = vector.make(lambda: gym.make("CartPole-v1"), 2, seed=0)
    ppo = PPO(env, Policy.from_env(env, hidden=8), PPOConfig(num_steps=4, update_epochs=1, num_minibatches=1))
    seen = []
    history = ppo.train(4 * 2 * 4, lambda stats: seen.append(stats) or answer)
    assert len(history) == len(seen) == iterations


def _rank(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    env = vector.make(lambda: gym.make("CartPole-v1"), 2, seed=100 * rank)
    torch.manual_seed(rank)  # different initial weights: PPO must broadcast rank 0's
    ppo = PPO(env, Policy.from_env(env, hidden=16), PPOConfig(num_steps=16, num_minibatches=2, update_epochs=2,
                                                               seed=rank))
    initial = {k: v.clone() for k, v in ppo.policy.state_dict().items()}
    ppo.train(2 * 16 * 2 * world)
    torch.save({"initial": initial, "final": ppo.policy.state_dict(), "obs": ppo.obs.clone(),
                "global_step": ppo.global_step}, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_two_gloo_ranks_hold_identical_weights_after_updates(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert not torch.equal(r0["obs"], r1["obs"]), "ranks must have stepped different envs"
    assert r0["global_step"] == r1["global_step"] == 2 * 16 * 2 * 2
    for name, w in r0["final"].items():
        torch.testing.assert_close(w, r1["final"][name], rtol=0, atol=0)
        torch.testing.assert_close(r0["initial"][name], r1["initial"][name], rtol=0, atol=0)
    assert any(not torch.equal(r0["initial"][k], r0["final"][k]) for k in r0["final"])


def test_compile_flag_trains_and_updates_weights():
    """PPOConfig(compile=True) on CPU: the minibatch loss (forward, losses and their backward) runs through
    torch.compile (Inductor), without graph breaks, and agrees with the eager loss; the rollout forward stays
    eager on CPU (compiled, it was slower at rollout batch sizes); two iterations train and the weights change."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    env = vector.make(lambda: gym.make("CartPole-v1"), 2, seed=0)
    ppo = PPO(env, Policy.from_env(env, hidden=16), PPOConfig(num_steps=8, num_minibatches=2, update_epochs=1,
                                                               compile=True))
    assert ppo.forward_eval == ppo.policy.forward_eval  # eager on CPU
    before = [p.detach().clone() for p in ppo.policy.parameters()]
    history = ppo.train(2 * 8 * 2)
    assert len(history) == 2 and all(np.isfinite(h["v_loss"]) for h in history)
    assert any(not torch.equal(a, b) for a, b in zip(before, ppo.policy.parameters()))
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])  # the minibatch loss
    assert not counters["graph_break"], dict(counters["graph_break"])
    advantages, returns = ppo.advantages()
    b = ppo._batch()
    b["advantages"], b["returns"] = ppo._segments(advantages), ppo._segments(returns)
    want_loss, want_terms, _ = ppo._minibatch_loss(b, slice(None), None)
    got_loss, got_terms, _ = ppo.minibatch_loss(b, slice(None), None)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-4, atol=1e-5)
    for got, want in zip(got_terms, want_terms):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_host_staging_path_stores_what_the_numpy_path_stores(network):
    """On CUDA, env arrays reach storage through pinned host copies sent once per rollout (the observation, and a
    recurrent policy's episode starts, each step) and actions leave through a host buffer; on CPU storage is
    written through numpy views. Run on CPU (``stage_on_host``, unpinned), the staging path must fill storage
    exactly as the numpy path does, episode starts, truncations and their final values included."""
    def run(staging: bool) -> PPO:
        env = vector.make(lambda: gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, 7), 3, seed=0)
        torch.manual_seed(0)
        cls = type("StagedPPO", (PPO,), {"stage_on_host": True}) if staging else PPO
        ppo = cls(env, Policy.from_env(env, network=network, hidden=8), PPOConfig(num_steps=12, seed=0))
        assert ppo.storage.staged == staging
        ppo.collect()
        ppo.collect()
        return ppo

    a, b = run(False), run(True)
    assert a.truncations.any() and a.starts[1:].any(), "episodes must end inside the rollout"
    for name in ("obs", "masks", "starts", "rewards", "terminals", "truncations", "actions", "logprobs", "values",
                 "final_values", "next_value"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


class RecordFinals:
    """A vector env that keeps a copy of every truncated row's final observation, by (step, row)."""

    def __init__(self, env):
        self.env, self.finals, self.t = env, {}, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, actions):
        out = self.env.step(actions)
        for row in np.flatnonzero(out[3] & ~out[2]):
            self.finals[self.t, int(row)] = self.env.final_observations[row].copy()
        self.t += 1
        return out


def test_final_values_computed_after_the_rollout_are_each_truncations_own_value():
    """The values of truncated rows' final observations are computed in one forward after the loop; each must
    equal the policy's value of that row's own final observation (MLP: no state)."""
    env = RecordFinals(vector.make("gridworld", 16, backend="numba", seed=0))
    torch.manual_seed(0)
    ppo = PPO(env, Policy.from_env(env, hidden=16), PPOConfig(num_steps=40, seed=0))
    ppo.collect()
    assert len(env.finals) >= 8, "the gridworld truncates after 24 steps"
    steps, rows = zip(*env.finals)
    with torch.no_grad():
        _, want, _ = ppo.policy.forward_eval(torch.as_tensor(np.stack(list(env.finals.values()))), ())
    torch.testing.assert_close(ppo.final_values[list(steps), list(rows)], want)
    untouched = torch.ones_like(ppo.final_values, dtype=torch.bool)
    untouched[list(steps), list(rows)] = False
    assert torch.all(ppo.final_values[untouched] == 0)
