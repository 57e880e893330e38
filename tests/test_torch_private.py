"""packrl.torch_private holds every use of torch's private API, each beside a public fallback. These tests fail when
a torch release removes one of those names or changes what it takes or computes (and then packrl runs the slower
public form until torch_private is updated), and they check that each fallback computes what the private form does.
They also check that no other packrl module names a private torch attribute."""
import ast
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packrl
from packrl import torch_private
from packrl.models.networks import GRU, LSTM

CPU_FUSED_ADAM = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4)


def _adam_buffers(seed: int, n: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    param, grad = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    return param, grad, torch.zeros(n), torch.zeros(n)


def test_the_private_names_exist_in_this_torch():
    assert torch_private._FUSED_ADAM is not None, "torch._fused_adam_ is gone: FlatAdam runs its seven public ops"
    assert torch_private._LSTM is not None and torch_private._GRU is not None, "torch._VF.lstm / gru are gone"


@pytest.mark.skipif(not CPU_FUSED_ADAM, reason="torch's CPU fused Adam kernel arrived in torch 2.4")
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), steps=st.integers(1, 5), lr=st.sampled_from([1e-4, 1e-3, 3e-2]))
def test_fused_adam_is_torch_adam_fused_bit_for_bit(seed, steps, lr):
    """``fused_adam`` (the private kernel, called directly) gives the bits of the public
    ``torch.optim.Adam(fused=True)``, and the public seven-op fallback ``adam_ops`` the same values to float
    rounding."""
    assert torch_private.fused_adam_runs(torch.zeros(1))
    param, grad, exp_avg, exp_avg_sq = _adam_buffers(seed, 37)
    public = torch.nn.Parameter(param.clone())
    optim = torch.optim.Adam([public], lr=lr, eps=1e-5, fused=True)
    ops_param, ops_avg, ops_avg_sq, denom = param.clone(), torch.zeros(37), torch.zeros(37), torch.zeros(37)
    count = torch.zeros(())
    for step in range(1, steps + 1):
        g = grad * step
        count.fill_(step)
        torch_private.fused_adam(param, g, exp_avg, exp_avg_sq, count, lr, 0.9, 0.999, 1e-5)
        torch_private.adam_ops(ops_param, g, ops_avg, ops_avg_sq, step, lr, 0.9, 0.999, 1e-5, denom)
        public.grad = g.clone()
        optim.step()
    assert torch.equal(param, public.detach()) and torch.equal(exp_avg_sq, optim.state[public]["exp_avg_sq"])
    torch.testing.assert_close(ops_param, param, rtol=1e-6, atol=1e-7)
    assert not torch.equal(param, _adam_buffers(seed, 37)[0])  # it moved


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_fused_recurrent_kernels_equal_the_stepped_cell(cls):
    """The fused kernels (``sequence`` without episode starts) and the public stepped cell (``sequence`` with an
    all-false ``done``, which takes the cell) give the same outputs, to float rounding."""
    torch.manual_seed(0)
    net = cls(5, 8)
    x = torch.randn(3, 6, 5)
    state = tuple(torch.randn_like(s) for s in net.initial_state(3))
    fused = (torch_private.fused_lstm(x, *state, net._params, False) if cls is LSTM
             else torch_private.fused_gru(x, *state, net._params, False))
    assert fused is not None
    stepped, stepped_state = net.sequence(x, state, torch.zeros(3, 6, dtype=torch.bool))
    torch.testing.assert_close(fused[0], stepped, rtol=1e-5, atol=1e-6)
    for got, want in zip(fused[1:], stepped_state):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_fallbacks_are_taken_when_the_private_names_are_missing(monkeypatch):
    """With the private names gone (as a future torch may have them), FlatAdam steps with the public ops and the
    recurrent networks step their cell, with the same results to float rounding."""
    from packrl.train.optimizer import FlatAdam

    torch.manual_seed(0)
    x = torch.randn(2, 4, 5)
    nets = {cls: cls(5, 8) for cls in (LSTM, GRU)}
    want = {cls: net.sequence(x, net.initial_state(2))[0] for cls, net in nets.items()}
    monkeypatch.setattr(torch_private, "_FUSED_ADAM", None)
    monkeypatch.setattr(torch_private, "_LSTM", None)
    monkeypatch.setattr(torch_private, "_GRU", None)
    assert not torch_private.fused_adam_runs(torch.zeros(1))
    assert torch_private.fused_lstm(x, torch.zeros(2, 8), torch.zeros(2, 8), nets[LSTM]._params, False) is None
    for cls, net in nets.items():
        torch.testing.assert_close(net.sequence(x, net.initial_state(2))[0], want[cls], rtol=1e-5, atol=1e-6)
    param = torch.nn.Parameter(torch.ones(4))
    flat = FlatAdam([param], 1e-2)
    assert not flat._fused
    param.grad.fill_(1.0)
    flat.step()
    torch.testing.assert_close(param.detach(), torch.full((4,), 0.99))  # Adam's first step: lr * sign


def test_forward_hooks_present_sees_every_kind_of_hook():
    """The hook registries torch_private reads are torch's own (a registered hook lands in them), and the fallback
    (the names missing) answers yes, so no form that skips module calls is taken."""
    from torch.nn.modules import module as torch_module

    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert not torch_private.forward_hooks_present(net)
    for register in (torch_module.register_module_forward_hook, torch_module.register_module_forward_pre_hook,
                     net[0].register_forward_hook, net[0].register_forward_pre_hook):
        handle = register(lambda *args: None)
        assert torch_private.forward_hooks_present(net)
        handle.remove()
    assert not torch_private.forward_hooks_present(net)


def test_forward_hooks_present_falls_back_to_yes(monkeypatch):
    monkeypatch.setattr(torch_private, "_GLOBAL_HOOKS", (None, None))
    assert torch_private.forward_hooks_present(torch.nn.Linear(2, 2))


def _private_torch_names(path: Path) -> list[str]:
    """Private torch names used in one source file: an import of a ``_``-name from torch (``torch._VF``,
    ``from torch.utils._pytree import ...``) and a ``_``-attribute read through a name bound to torch or one of its
    modules (``torch._fused_adam_``, ``torch_module._global_forward_hooks``)."""
    tree = ast.parse(path.read_text())
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    aliases.add(a.asname or a.name.split(".")[0])
                    if any(part.startswith("_") for part in a.name.split(".")):
                        found.append(f"{path.name}:{node.lineno} import {a.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                aliases.add(a.asname or a.name)
                if any(part.startswith("_") for part in node.module.split(".") + [a.name]):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
                and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")):
            found.append(f"{path.name}:{node.lineno} getattr({node.args[0].id}, {node.args[1].value!r})")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                found.append(f"{path.name}:{node.lineno} {base.id}...{node.attr}")
    return found


def test_no_other_packrl_module_names_torch_private_api(tmp_path):
    root = Path(packrl.__file__).parent
    found = [hit for path in sorted(root.rglob("*.py")) if path != Path(torch_private.__file__)
             for hit in _private_torch_names(path)]
    assert found == [], f"torch private API outside packrl/torch_private.py: {found}"
    assert len(_private_torch_names(Path(torch_private.__file__))) >= 2  # the scan sees them where they are
    sample = tmp_path / "sample.py"  # each form the scan knows, once
    sample.write_text("import torch\nfrom torch import nn\nfrom torch.nn.modules import module as m\n"
                      "import torch._dynamo\nfrom torch.utils._pytree import tree_map\n"
                      "torch._fused_adam_\nm._global_forward_hooks\ngetattr(torch, '_VF')\nnn.Linear\n")
    assert len(_private_torch_names(sample)) == 5, _private_torch_names(sample)
