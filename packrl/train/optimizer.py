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
    """Scale the gradients so their global L2 norm is at most ``max_norm``: what CleanRL's
    ``nn.utils.clip_grad_norm_`` computes (the norm of the per-tensor norms, 1e-6, the scale capped at 1),
    written out because its per-call grouping of tensors costs a small network twice the clipping itself
    (benchmarks/README.md). Returns the norm before clipping, a tensor (no host sync); 0 without gradients."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else "cpu")
    if len({(g.device, g.dtype) for g in grads}) > 1:
        return nn.utils.clip_grad_norm_(params, max_norm).float()
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(scale)
    return total


def zero_grad(params: list[torch.Tensor]) -> None:
    """``optimizer.zero_grad(set_to_none=True)`` for these parameters, without its profiler record per call
    (about as long as the rest of it for a small network)."""
    for p in params:
        p.grad = None
