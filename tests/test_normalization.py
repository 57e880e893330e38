"""Observation normalization inside the Layout encoder and reward scaling for the learner (issue 30): running
statistics against plain numpy references, kept with the weights or the training state, and what they change."""
import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from packrl import vector
from packrl.emulation import Layout
from packrl.models import LayoutEncoder, Policy
from packrl.train.ppo import PPO, PPOConfig
from packrl.train.reward_scaling import CLIP, RewardScaler

SPACE = spaces.Dict({"pos": spaces.Box(-np.inf, np.inf, (3,), np.float32), "speed": spaces.Box(-2, 2, (2,), np.float64),
                     "room": spaces.Discrete(4)})


def _rows(layout, n, seed, scale=50.0):
    rng = np.random.default_rng(seed)
    out = np.zeros((n, layout.nbytes), np.uint8)
    for i in range(n):
        layout.pack({"pos": (rng.normal(7.0, scale, 3)).astype(np.float32), "speed": rng.uniform(-2, 2, 2),
                     "room": int(rng.integers(4))}, out[i])
    return torch.from_numpy(out)


def test_normalized_flat_features_have_zero_mean_and_unit_variance_on_the_data_seen():
    layout = Layout.from_space(SPACE)
    encoder = LayoutEncoder(layout, 8, normalize=True)
    first, second = _rows(layout, 300, 0), _rows(layout, 500, 1)
    raw = LayoutEncoder(layout, 8)._flat(torch.cat([first, second]))  # bound-scaled, not normalized
    encoder.update_normalization(first)
    encoder.update_normalization(second)  # two merges equal one pass over all the rows
    np.testing.assert_allclose(encoder.obs_mean.numpy(), raw.double().mean(0).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(encoder.obs_var.numpy(), raw.double().var(0, unbiased=False).numpy(), rtol=1e-5)
    features = encoder._flat(torch.cat([first, second])).double()
    np.testing.assert_allclose(features.mean(0).numpy(), 0.0, atol=1e-4)
    np.testing.assert_allclose(features.std(0, unbiased=False).numpy(), 1.0, atol=1e-3)
    far = encoder._flat(_rows(layout, 4, 2, scale=1e6))
    assert far.abs().max() <= 10.0  # clipped as CleanRL's and SB3's normalization clip


def test_normalization_travels_with_the_weights_and_is_off_by_default():
    layout = Layout.from_space(SPACE)
    torch.manual_seed(0)
    policy = Policy.from_layouts(layout, spaces.Discrete(3), hidden=8, normalize_observations=True)
    x = _rows(layout, 64, 3)
    before = policy.forward_eval(x, ())[0]
    policy.update_normalization(x)
    after = policy.forward_eval(x, ())[0]
    assert not torch.allclose(before, after)
    torch.manual_seed(0)
    loaded = Policy.from_layouts(layout, spaces.Discrete(3), hidden=8, normalize_observations=True)
    loaded.load_state_dict(policy.state_dict())
    torch.testing.assert_close(loaded.forward_eval(x, ())[0], after)
    plain = Policy.from_layouts(layout, spaces.Discrete(3), hidden=8)
    plain.update_normalization(x)  # a no-op without normalization
    assert "encoder.obs_mean" not in plain.state_dict()


def _reference_returns(rewards, ended, acted, gamma):
    returns, out = np.zeros(rewards.shape[1]), []
    for t in range(rewards.shape[0]):
        returns = returns * gamma + rewards[t]
        out += list(returns[acted[t]])
        returns = np.where(ended[t], 0.0, returns)
    return np.array(out)


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 12), N=st.integers(1, 5), chunks=st.integers(1, 3), seed=st.integers(0, 2**16),
       gamma=st.floats(0.5, 0.999))
def test_reward_scaler_statistics_equal_the_variance_of_every_discounted_return(T, N, chunks, seed, gamma):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(0, 3, (T * chunks, N))
    ended, acted = rng.random((T * chunks, N)) < 0.2, rng.random((T * chunks, N)) < 0.8
    scaler = RewardScaler(N, gamma)
    for c in range(chunks):  # rollouts one after another carry each row's return across them
        part = slice(c * T, (c + 1) * T)
        factor = scaler.update(rewards[part], ended[part], acted[part])
    want = _reference_returns(rewards, ended, acted, gamma)
    if want.size:
        np.testing.assert_allclose(scaler.mean, want.mean(), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(scaler.var, want.var(), rtol=1e-6, atol=1e-9)
        assert np.isclose(factor, 1 / np.sqrt(want.var() + 1e-8))


def test_ppo_scales_only_the_learners_rewards_and_resumes_the_statistics():
    def run(normalize):
        env = vector.make(lambda: gym.make("Pendulum-v1"), 2, seed=0)
        torch.manual_seed(0)
        ppo = PPO(env, Policy.from_env(env, hidden=8), PPOConfig(num_steps=256, normalize_rewards=normalize, seed=0))
        ppo.collect()
        return ppo

    plain, scaled = run(False), run(True)
    torch.testing.assert_close(plain.rewards, scaled.rewards)  # storage and episode returns keep the env's units
    factor = scaled.reward_scaler.factor
    assert 0.001 < factor < 1.0  # Pendulum's discounted returns spread far beyond 1
    torch.testing.assert_close(scaled.train_rewards, (plain.rewards * factor).clamp(-CLIP, CLIP))
    state = scaled.training_state()
    assert state["reward_scaling"]["count"] == 512
    resumed = run(True)
    resumed.load_training_state(state, resumed.policy.state_dict(), None)
    assert resumed.reward_scaler.state() == scaled.reward_scaler.state()
    assert not resumed.reward_scaler.returns.any()  # envs were reset: carried returns start over


def test_ppo_updates_observation_statistics_after_each_update_with_the_acting_rows():
    env = vector.make(lambda: gym.make("Pendulum-v1"), 2, seed=0)
    torch.manual_seed(0)
    policy = Policy.from_env(env, hidden=8, normalize_observations=True)
    ppo = PPO(env, policy, PPOConfig(num_steps=64, num_minibatches=2, update_epochs=1, seed=0))
    ppo.collect()
    assert policy.encoder.obs_count == 0  # the rollout and its update read the statistics of before it
    ppo.update()
    assert policy.encoder.obs_count == 128
    obs = ppo.obs.reshape(-1, *ppo.obs.shape[2:]).double()
    np.testing.assert_allclose(policy.encoder.obs_mean.numpy(),
                               (obs * policy.encoder.bounds_scale.double() + policy.encoder.bounds_shift.double())
                               .mean(0).numpy(), rtol=1e-5, atol=1e-6)
