"""The optimizer PPO steps and the gradient clipping before each step, with torch's public APIs."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def adam(params: Iterable[torch.Tensor], lr: float) -> torch.optim.Adam:
    """Adam with CleanRL's eps (1e-5); torch's fused kernel (``fused=True``) where this torch has it for the
    parameters' device, else its default (foreach) implementation."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, eps=1e-5, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, eps=1e-5)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients so their global L2 norm is at most ``max_norm`` (CleanRL's
    ``nn.utils.clip_grad_norm_``); returns the norm before clipping, a float32 tensor (no host sync)."""
    return nn.utils.clip_grad_norm_(params, max_norm, foreach=True).float()
