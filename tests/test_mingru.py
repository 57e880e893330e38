"""MinGRU: the paper's recurrence (Feng et al. 2024, "Were RNNs All We Needed?") step by step, and learning a
memory task in a bounded number of steps (as the GRU does; chance is 0.25)."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from packrl import vector
from packrl.models import Policy
from packrl.models.networks import MinGRU
from packrl.train.evaluate import evaluate
from packrl.train.ppo import PPO, PPOConfig


class CueThenAnswer(gym.Env):
    """Step 0 shows one of 4 cues, ``delay`` blank steps follow, then a flag asks for the answer: reward 1
    when the action names the cue, 0 otherwise, and the episode ends. Only memory can beat 0.25."""

    observation_space = gym.spaces.Box(0, 1, (5,), np.float32)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, delay: int = 4):
        self.delay = delay

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(4)), 0
        return np.eye(5, dtype=np.float32)[self.cue], {}

    def step(self, action):
        if self.t == self.delay:
            return np.zeros(5, np.float32), float(int(action) == self.cue), True, False, {}
        self.t += 1
        return (np.eye(5, dtype=np.float32)[4] if self.t == self.delay else np.zeros(5, np.float32)), 0.0, False, False, {}


def paper_mingru(net: MinGRU, x: torch.Tensor, h0: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """h_t = (1 - z_t) h_{t-1} + z_t h~_t, z = sigmoid(W_z x), h~ = g(W_h x), g(v) = v + 0.5 (v >= 0) else
    sigmoid(v), a reset (done) zeroing h_{t-1}; a float64 loop over time, then the output LayerNorm."""
    w, b = net.proj.weight.double(), net.proj.bias.double()
    H = net.hidden_size
    h, outputs = h0.double(), []
    for t in range(x.shape[1]):
        pre = x[:, t].double() @ w.T + b
        z, v = torch.sigmoid(pre[:, :H]), pre[:, H:]
        candidate = torch.where(v >= 0, v + 0.5, torch.sigmoid(v))
        h = torch.where(done[:, t, None], 0.0, h)
        h = (1 - z) * h + z * candidate
        outputs.append(h)
    hs = torch.stack(outputs, 1)
    return torch.nn.functional.layer_norm(hs, (H,), net.norm.weight.double(), net.norm.bias.double()), h


def test_sequence_and_steps_follow_the_papers_recurrence_with_resets():
    torch.manual_seed(0)
    net = MinGRU(6, 16)
    with torch.no_grad():
        net.norm.weight.normal_()
        net.norm.bias.normal_()
    x, h0 = torch.randn(3, 37, 6), torch.rand(3, 16)
    done = torch.rand(3, 37) < 0.15
    expected, last = paper_mingru(net, x, h0, done)
    y, (h,) = net.sequence(x, (h0,), done)
    torch.testing.assert_close(y.double(), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h.double(), last, atol=1e-4, rtol=1e-4)
    state, steps = (h0,), []
    for t in range(37):
        out, state = net.step(x[:, t], state, done[:, t])
        steps.append(out)
    torch.testing.assert_close(torch.stack(steps, 1).double(), expected, atol=1e-4, rtol=1e-4)


def test_update_gate_starts_keeping_the_state():
    net = MinGRU(8, 32)
    z = torch.sigmoid(net.proj(torch.zeros(1, 8))[:, :32])
    assert torch.allclose(z, torch.full_like(z, float(torch.sigmoid(torch.tensor(MinGRU.GATE_BIAS)))))
    assert z.max() < 0.2  # the state is mostly kept at first (it was halved each step before)


@pytest.mark.parametrize("network", ["mingru", "gru"])
def test_recurrent_policy_learns_cue_then_answer(network):
    """PPO for 16k agent steps (16 envs, delay 4): the greedy policy answers >= 0.9 of 64 episodes right.
    Measured (seed 0): minGRU 0.95 by 15k steps at delay 4 as the GRU; minGRU with the paper's plain
    initialisation and no output norm stood at 0.26 after 16k (0.45 after 40k)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = vector.make(CueThenAnswer, 16, seed=0)
    policy = Policy.from_env(env, network=network, hidden=64)
    config = PPOConfig(num_steps=32, learning_rate=1e-3, ent_coef=0.01, update_epochs=4, num_minibatches=4, seed=0)
    PPO(env, policy, config).train(16_000)
    env.close()
    returns = evaluate(policy, vector.make(CueThenAnswer, 16, seed=1), episodes=64)
    assert returns.mean() >= 0.9, returns.mean()
