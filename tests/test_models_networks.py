"""Networks: stepping equals training over time (resets mid-sequence included), the fused kernels
equal the stepwise cells, and MinGRU's parallel scan equals its recurrence."""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from packrl.emulation import Layout
from packrl.models import GRU, LSTM, Policy, linear_scan

OBS = spaces.Dict({"pos": spaces.Box(-1, 1, (3,), np.float32), "seen": spaces.Box(0, 1, (2,), bool),
                   "room": spaces.Discrete(4, start=1), "action_mask": spaces.MultiBinary(5)})
LAYOUT = Layout.from_space(OBS)


def _rows(batch, steps, seed):
    OBS.seed(seed)
    rows = LAYOUT.pack_batch([OBS.sample() for _ in range(batch * steps)])
    return torch.from_numpy(rows).reshape(batch, steps, -1)


@pytest.mark.parametrize("network", ["mlp", "lstm", "gru", "mingru"])
def test_forward_eval_steps_equal_forward_with_resets(network):
    torch.manual_seed(0)
    batch, steps = 4, 9
    policy = Policy.from_layouts(LAYOUT, spaces.Discrete(5), network, hidden=16, action_mask=("action_mask",))
    x = _rows(batch, steps, seed=1)
    done = torch.zeros(batch, steps, dtype=torch.bool)
    done[0, 3] = done[1, 1] = done[1, 7] = done[3, 8] = True
    state = tuple(s + torch.randn_like(s) for s in policy.initial_state(batch))  # a carried-over state
    logits, values, final = policy(x, state, done)
    assert logits.shape == (batch, steps, 5) and values.shape == (batch, steps)
    step_state, step_logits, step_values = state, [], []
    for t in range(steps):
        lg, v, step_state = policy.forward_eval(x[:, t], step_state, done[:, t])
        step_logits.append(lg)
        step_values.append(v)
    torch.testing.assert_close(torch.stack(step_logits, 1), logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(step_values, 1), values, rtol=1e-5, atol=1e-5)
    for a, b in zip(step_state, final):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if network != "mlp":  # a reset must matter: the same rows without it give other outputs
        other, _, _ = policy(x, state, torch.zeros_like(done))
        assert not torch.allclose(other[0, 3:], logits[0, 3:])
        torch.testing.assert_close(other[2], logits[2])  # row 2 has no reset


def test_reset_state_equals_fresh_state():
    torch.manual_seed(0)
    policy = Policy.from_layouts(LAYOUT, spaces.Discrete(5), "lstm", hidden=8)
    x = _rows(2, 1, seed=2)[:, 0]
    state = tuple(torch.randn_like(s) for s in policy.initial_state(2))
    reset, _, _ = policy.forward_eval(x, state, torch.ones(2, dtype=torch.bool))
    fresh, _, _ = policy.forward_eval(x, policy.initial_state(2))
    torch.testing.assert_close(reset, fresh)


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_fused_kernel_equals_stepwise_cell(cls):
    torch.manual_seed(0)
    net = cls(6, 10)
    x = torch.randn(3, 7, 6)
    state = tuple(torch.randn_like(s) for s in net.initial_state(3))
    fused, fused_state = net.sequence(x, state)  # no resets: the fused kernel
    stepped, stepped_state = net.sequence(x, state, torch.zeros(3, 7, dtype=torch.bool))
    torch.testing.assert_close(fused, stepped, rtol=1e-5, atol=1e-5)
    for a, b in zip(fused_state, stepped_state):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    reference = (torch.nn.LSTM if cls is LSTM else torch.nn.GRU)(6, 10, batch_first=True)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(reference, name + "_l0").copy_(getattr(net, name))
        h0 = tuple(s.unsqueeze(0) for s in state)
        want, _ = reference(x, h0 if cls is LSTM else h0[0])
    torch.testing.assert_close(fused, want, rtol=1e-5, atol=1e-5)


@given(steps=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_linear_scan_equals_the_recurrence(steps, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(2, steps, 3, generator=gen) * (torch.rand(2, steps, 3, generator=gen) > 0.1)  # some resets (a = 0)
    b = torch.randn(2, steps, 3, generator=gen)
    h0 = torch.randn(2, 3, generator=gen)
    a_cum, b_cum = linear_scan(a, b)
    h, want = h0, []
    for t in range(steps):
        h = a[:, t] * h + b[:, t]
        want.append(h)
    torch.testing.assert_close(a_cum * h0.unsqueeze(1) + b_cum, torch.stack(want, 1), rtol=1e-5, atol=1e-5)
