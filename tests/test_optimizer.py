"""FlatAdam: torch.optim.Adam's update over one flat buffer, with gradients that backward accumulates into it."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from packrl.train.optimizer import FlatAdam, TorchAdam, adam


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _loss(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (net(x) ** 2).sum() * 50  # large gradients, so clipping acts


def _train(net: nn.Module, optimizer, xs: list[torch.Tensor], zero) -> list[torch.Tensor]:
    norms = []
    for x in xs:
        zero()
        _loss(net, x).backward()
        norms.append(optimizer.clip_grad_norm(0.5) if hasattr(optimizer, "clip_grad_norm")
                     else nn.utils.clip_grad_norm_(net.parameters(), 0.5))
        optimizer.step()
    return norms


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), steps=st.integers(1, 6), lr=st.sampled_from([1e-4, 1e-3, 3e-2]),
       fused=st.booleans())
def test_flat_adam_follows_torch_adam_through_backward_and_clipping(seed, steps, lr, fused):
    """Same weights, same batches: FlatAdam (gradients accumulated by backward into its buffer), with torch's fused
    kernel or its seven whole-buffer ops, and torch.optim.Adam with nn.utils.clip_grad_norm_ give the same norms
    and the same weights at every step."""
    ours, ref = _net(seed), _net(seed)
    flat = adam(ours.parameters(), lr)
    assert isinstance(flat, FlatAdam)
    flat._fused = fused and flat._fused
    torch_adam = torch.optim.Adam(ref.parameters(), lr=lr, eps=1e-5, foreach=False)
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(16, 4, generator=gen) for _ in range(steps)]
    got = _train(ours, flat, xs, flat.zero_grad)
    want = _train(ref, torch_adam, xs, torch_adam.zero_grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert not torch.equal(ours[0].weight, _net(seed)[0].weight)  # it did move


def test_parameters_are_views_of_the_buffer_and_backward_fills_the_gradient_buffer():
    net = _net(0)
    opt = FlatAdam(net.parameters(), 1e-3)
    assert all(p.data_ptr() >= opt.flat.data_ptr() for p in net.parameters())
    _loss(net, torch.ones(2, 4)).backward()
    assert opt.grad.abs().sum() > 0
    assert torch.equal(torch.cat([p.grad.reshape(-1) for p in net.parameters()]), opt.grad)
    opt.zero_grad()
    assert all(p.grad.abs().sum() == 0 for p in net.parameters())


def test_gradients_set_aside_by_other_code_are_taken_back():
    """``module.zero_grad()`` (set_to_none) and a new .grad tensor: the step still sees backward's gradients
    and the weights stay views of the buffer."""
    ours, ref = _net(1), _net(1)
    opt = FlatAdam(ours.parameters(), 1e-2)
    torch_adam = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    x = torch.randn(8, 4)
    for net, o in ((ours, opt), (ref, torch_adam)):
        net.zero_grad(set_to_none=True)
        _loss(net, x).backward()
        o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert all(p.grad.data_ptr() >= opt.grad.data_ptr() for p in ours.parameters())


def test_state_dict_moves_between_flat_adam_and_torch_adam():
    """A checkpoint's optimizer state from torch.optim.Adam resumes in FlatAdam and back, continuing the same
    trajectory as torch.optim.Adam alone."""
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(8, 4, generator=gen) for _ in range(6)]
    ref = _net(2)
    ref_adam = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    _train(ref, ref_adam, xs, ref_adam.zero_grad)

    first = _net(2)
    first_adam = torch.optim.Adam(first.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    _train(first, first_adam, xs[:2], first_adam.zero_grad)
    second = _net(99)
    second.load_state_dict(first.state_dict())
    flat = FlatAdam(second.parameters(), 1e-2)
    flat.load_state_dict(first_adam.state_dict())
    assert flat.steps == 2
    _train(second, flat, xs[2:4], flat.zero_grad)
    third = _net(7)
    third.load_state_dict(second.state_dict())
    third_adam = torch.optim.Adam(third.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    third_adam.load_state_dict(flat.state_dict())
    _train(third, third_adam, xs[4:], third_adam.zero_grad)
    for p, q in zip(third.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_state_for_other_parameters_is_refused_naming_the_mismatch():
    opt = FlatAdam(_net(0).parameters(), 1e-3)
    other = nn.Linear(4, 5)
    other_adam = torch.optim.Adam(other.parameters())
    other(torch.ones(1, 4)).sum().backward()
    other_adam.step()
    with pytest.raises(ValueError, match="one group of 4 parameters"):
        opt.load_state_dict(other_adam.state_dict())
    bigger = nn.Sequential(nn.Linear(4, 9), nn.Tanh(), nn.Linear(9, 3))
    bigger_adam = torch.optim.Adam(bigger.parameters())
    bigger(torch.ones(1, 4)).sum().backward()
    bigger_adam.step()
    with pytest.raises(ValueError, match=r"parameter 0: exp_avg has shape \(9, 4\), the parameter \(8, 4\)"):
        opt.load_state_dict(bigger_adam.state_dict())


def test_a_frozen_parameter_never_moves():
    net = _net(0)
    net[0].bias.requires_grad_(False)
    before = net[0].bias.detach().clone()
    opt = FlatAdam(net.parameters(), 1e-1)
    for _ in range(3):
        opt.zero_grad()
        _loss(net, torch.randn(4, 4)).backward()
        opt.clip_grad_norm(0.5)
        opt.step()
    assert torch.equal(net[0].bias.detach(), before)
    assert not torch.equal(net[0].weight.detach(), _net(0)[0].weight.detach())


def test_mixed_dtypes_fall_back_to_torch_adam():
    params = [nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2, dtype=torch.float64))]
    assert isinstance(adam(params, 1e-3), TorchAdam)



def test_the_fused_kernel_is_taken_where_torch_has_it_on_cpu():
    """Recent torch has a CPU fused Adam kernel (what torch.optim.Adam(fused=True) calls): FlatAdam takes it there."""
    flat = adam(_net(0).parameters(), 1e-3)
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    if (major, minor) >= (2, 5):
        assert flat._fused
