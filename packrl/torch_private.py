"""Every use packrl makes of torch's private API, each beside its public fallback.

torch's underscore names can change or go in any release. Each function here takes the private form where this torch
has it and behaves as packrl expects, and otherwise the public form, which computes the same thing more slowly.
``tests/test_torch_private.py`` checks that every private name still exists, takes the arguments used here and gives
the public form's result, so a torch release that changes one fails that test rather than a training run.

- ``fused_adam``: ``torch._fused_adam_``, the kernel ``torch.optim.Adam(fused=True)`` calls, over one flat buffer
  without the optimizer's per-step bookkeeping (FlatAdam, ``packrl/train/optimizer.py``). Public fallback:
  Adam's update as seven whole-buffer ops (``adam_ops``).
- ``forward_hooks_present``: torch's global forward-hook registries
  (``torch.nn.modules.module._global_forward_hooks``, ``_global_forward_pre_hooks``) and each module's own
  (``_forward_hooks``, ``_forward_pre_hooks``), read so that a form that bypasses module calls is not taken where
  a hook would run (``packrl.models.fast_forms``). torch has no public way to ask; where the names are missing
  the answer is "yes", and the policy runs its modules, which call every hook.
- ``fused_lstm`` / ``fused_gru``: ``torch._VF.lstm`` / ``torch._VF.gru``, the fused kernels ``nn.LSTM`` and
  ``nn.GRU`` call, for a sequence without episode starts (``packrl/models/networks.py``). None where missing: the
  caller steps the cell, the public form.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.modules import module as _module

_FUSED_ADAM = getattr(torch, "_fused_adam_", None)
_VF = getattr(torch, "_VF", None)
_LSTM = getattr(_VF, "lstm", None)
_GRU = getattr(_VF, "gru", None)
_GLOBAL_HOOKS = tuple(getattr(_module, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks"))
_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks")


def forward_hooks_present(module: nn.Module) -> bool:
    """Whether a forward hook or pre-hook (global, or on ``module`` or any submodule) would run on a module call;
    True where this torch keeps them elsewhere than packrl knows (so nothing that would skip them is taken)."""
    if any(hooks is None or hooks for hooks in _GLOBAL_HOOKS):
        return True
    return any(getattr(m, name, True) for m in module.modules() for name in _MODULE_HOOKS)



def adam_ops(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
             step: int, lr: float, beta1: float, beta2: float, eps: float, denom: torch.Tensor) -> None:
    """torch.optim.Adam's update (no weight decay, no amsgrad) of ``param`` in place, as public whole-buffer ops;
    ``denom`` is scratch of ``param``'s shape."""
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    torch.sqrt(exp_avg_sq, out=denom).div_(math.sqrt(1 - beta2 ** step)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1 ** step))


def fused_adam_runs(like: torch.Tensor) -> bool:
    """Whether ``fused_adam`` takes torch's fused kernel for ``like``'s device and dtype (CPU from torch 2.4): the
    kernel exists and runs on a two-element buffer."""
    if _FUSED_ADAM is None:
        return False
    param, grad, exp_avg, exp_avg_sq = (torch.zeros(2, dtype=like.dtype, device=like.device) for _ in range(4))
    step = torch.ones((), dtype=torch.float32, device=like.device)
    try:
        _fused_adam_kernel(param, grad, exp_avg, exp_avg_sq, step, 1e-3, 0.9, 0.999, 1e-5)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def fused_adam(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               step: torch.Tensor, lr: float, beta1: float, beta2: float, eps: float) -> None:
    """torch.optim.Adam(fused=True)'s update of ``param`` in place, ``step`` (a float32 scalar tensor) holding the
    step number; call only where ``fused_adam_runs`` said yes (``adam_ops`` otherwise)."""
    _fused_adam_kernel(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps)


def _fused_adam_kernel(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                       step: torch.Tensor, lr: float, beta1: float, beta2: float, eps: float) -> None:
    _FUSED_ADAM([param], [grad], [exp_avg], [exp_avg_sq], [], [step], lr=lr, beta1=beta1, beta2=beta2,
                weight_decay=0.0, eps=eps, amsgrad=False, maximize=False)


def fused_lstm(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, params: list[torch.Tensor], training: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """One batch-first LSTM layer over ``x (B, T, in)`` from ``(h, c)`` (each ``(B, hidden)``) with PyTorch's
    parameters ``[weight_ih, weight_hh, bias_ih, bias_hh]``: ``(y (B, T, hidden), h, c)``; None where this torch
    has no such kernel."""
    if _LSTM is None:
        return None
    y, h, c = _LSTM(x, (h.unsqueeze(0), c.unsqueeze(0)), params, True, 1, 0.0, training, False, True)
    return y, h[0], c[0]


def fused_gru(x: torch.Tensor, h: torch.Tensor, params: list[torch.Tensor], training: bool
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One batch-first GRU layer over ``x (B, T, in)`` from ``h (B, hidden)``: ``(y (B, T, hidden), h)``; None
    where this torch has no such kernel."""
    if _GRU is None:
        return None
    y, h = _GRU(x, h.unsqueeze(0), params, True, 1, 0.0, training, False, True)
    return y, h[0]
