"""Data-parallel PPO over ``torch.distributed`` (``torchrun``): every rank steps its own envs, starts from
rank 0's weights and averages its gradients with the other ranks' before each optimizer step."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def rank_and_world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when no process group is initialised."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def broadcast_parameters(module: nn.Module) -> None:
    """Every rank takes rank 0's weights (and buffers)."""
    for tensor in module.state_dict().values():
        dist.broadcast(tensor.data, src=0)


def average_gradients(params: list[torch.Tensor]) -> None:
    """One all-reduce over all gradients flattened together (DDP's effect, without wrapping the policy:
    PPO calls ``forward_eval`` and ``forward``, which DDP's hooks on ``__call__`` would miss)."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def all_sum(value: int, device: torch.device) -> int:
    """``value`` summed over ranks (on the GPU for NCCL, which has no CPU tensors)."""
    t = torch.tensor([value], dtype=torch.int64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return int(t.item())
