"""The optimizer PPO steps, with the gradient zeroing and clipping around each step.

``adam(params, lr)`` returns a ``FlatAdam`` when every parameter shares one device and floating dtype (a
policy's usual case), else a ``TorchAdam``. Both have ``zero_grad()``, ``clip_grad_norm(max_norm)``,
``step()``, ``param_groups`` and torch.optim.Adam's ``state_dict`` format, so a checkpoint saved by one loads
into the other.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from packrl.torch_private import adam_ops, fused_adam, fused_adam_runs

EPS = 1e-5  # CleanRL's Adam eps


def adam(params: Iterable[torch.Tensor], lr: float) -> "FlatAdam | TorchAdam":
    """Adam with CleanRL's eps over ``params``: one flat buffer where it can (``FlatAdam``), torch's otherwise."""
    params = list(params)
    if params and len({(p.device, p.dtype) for p in params}) == 1 and params[0].is_floating_point():
        return FlatAdam(params, lr)
    return TorchAdam(params, lr)


class FlatAdam:
    """torch.optim.Adam's update (no weight decay, no amsgrad) over one buffer that holds every parameter and one
    that holds every gradient. The parameters become views of the first and their ``.grad`` views of the
    second, which backward accumulates into in place. Zeroing, clipping and the update are then a few
    whole-buffer operations, where torch.optim.Adam.step's per-parameter bookkeeping costs a small PPO network
    more than its arithmetic (benchmarks/README.md, issue 21). The update is torch's fused Adam kernel where this
    torch has one for the buffer's device (one op, ``packrl.torch_private.fused_adam``), else seven whole-buffer
    ops (``adam_ops``, public torch).

    A parameter that gets no gradient in a step keeps a zero gradient, so it moves only by its first moment
    (torch.optim.Adam skips it instead); a frozen parameter never gets one and never moves."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = EPS):
        self.params = list(params)
        if not self.params:
            raise ValueError("FlatAdam got an empty parameter list")
        self.shapes = [p.shape for p in self.params]
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for p in self.params:
            self.bounds.append((start, start + p.numel()))
            start += p.numel()
        with torch.no_grad():
            self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.grad = torch.zeros_like(self.flat)
        self.exp_avg, self.exp_avg_sq, self._denom = (torch.zeros_like(self.flat) for _ in range(3))
        self._param_views = [self.flat[a:b].view(shape) for (a, b), shape in zip(self.bounds, self.shapes)]
        self._grad_views = [self.grad[a:b].view(shape) for (a, b), shape in zip(self.bounds, self.shapes)]
        for p, data in zip(self.params, self._param_views):
            p.data = data
        self._pointers = [p.data_ptr() for p in self.params]
        self._attach_grads()
        self.steps = 0
        self._step_count = torch.zeros((), dtype=torch.float32, device=self.flat.device)
        self._fused = fused_adam_runs(self.flat)
        self.param_groups = [{"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": 0.0, "amsgrad": False,
                              "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                              "fused": None}]

    def _attach_grads(self) -> None:
        for p, grad in zip(self.params, self._grad_views):
            p.grad = grad

    def _check_views(self) -> None:
        """Put back what other code replaced: a ``.grad`` set to None or to a new tensor (``policy.zero_grad()``
        does that), or parameter data moved elsewhere (``load_state_dict(assign=True)``, ``.to()``)."""
        for p, data, grad, pointer in zip(self.params, self._param_views, self._grad_views, self._pointers):
            if p.data_ptr() != pointer:
                with torch.no_grad():
                    data.copy_(p.data)
                p.data = data
            if p.grad is not grad:
                with torch.no_grad():
                    grad.copy_(p.grad) if p.grad is not None else grad.zero_()
                p.grad = grad

    def zero_grad(self) -> None:
        self.grad.zero_()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients so their global L2 norm is at most ``max_norm`` (``nn.utils.clip_grad_norm_``'s
        rule: the scale ``max_norm / (norm + 1e-6)`` capped at 1). Returns the norm before clipping, a tensor."""
        self._check_views()
        total = torch.linalg.vector_norm(self.grad)
        self.grad.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return total

    @torch.no_grad()
    def step(self) -> None:
        self._check_views()
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        self.steps += 1
        if self._fused:  # one kernel for the whole update (torch.optim.Adam(fused=True)'s, without its bookkeeping)
            self._step_count.fill_(self.steps)
            fused_adam(self.flat, self.grad, self.exp_avg, self.exp_avg_sq, self._step_count, group["lr"], beta1,
                       beta2, group["eps"])
            return
        adam_ops(self.flat, self.grad, self.exp_avg, self.exp_avg_sq, self.steps, group["lr"], beta1, beta2,
                 group["eps"], self._denom)

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam's format: per-parameter ``step``, ``exp_avg``, ``exp_avg_sq`` (copies)."""
        state = {}
        if self.steps:
            for i, ((a, b), shape) in enumerate(zip(self.bounds, self.shapes)):
                state[i] = {"step": torch.tensor(float(self.steps)), "exp_avg": self.exp_avg[a:b].view(shape).clone(),
                            "exp_avg_sq": self.exp_avg_sq[a:b].view(shape).clone()}
        return {"state": state, "param_groups": [dict(self.param_groups[0], params=list(range(len(self.params))))]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state saved by ``state_dict()`` or by torch.optim.Adam over the same parameters (ValueError
        naming the mismatch otherwise)."""
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != 1 or len(groups[0].get("params", ())) != len(self.params):
            raise ValueError(f"optimizer state has {len(groups) if isinstance(groups, list) else 'no'} parameter "
                             f"group(s); this optimizer has one group of {len(self.params)} parameters")
        entries = state_dict.get("state", {})
        steps = set()
        exp_avg, exp_avg_sq = torch.zeros_like(self.flat), torch.zeros_like(self.flat)
        for i, param_id in enumerate(groups[0]["params"]):
            entry = entries.get(param_id, entries.get(str(param_id)))
            if not entry:
                continue
            (a, b), shape = self.bounds[i], self.shapes[i]
            for key, target in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                value = entry.get(key)
                if not isinstance(value, torch.Tensor) or value.shape != shape:
                    raise ValueError(f"optimizer state of parameter {i}: {key} has shape "
                                     f"{tuple(getattr(value, 'shape', ())) or None}, the parameter {tuple(shape)}")
                target[a:b] = value.reshape(-1)
            steps.add(int(float(entry["step"])))
        if len(steps) > 1:
            raise ValueError(f"optimizer state: parameters were stepped different numbers of times {sorted(steps)}; "
                             "FlatAdam steps every parameter together")
        self.exp_avg.copy_(exp_avg)
        self.exp_avg_sq.copy_(exp_avg_sq)
        self.steps = steps.pop() if steps else 0
        for key in ("lr", "betas", "eps"):
            if key in groups[0]:
                self.param_groups[0][key] = tuple(groups[0][key]) if key == "betas" else float(groups[0][key])


class TorchAdam(torch.optim.Adam):
    """torch.optim.Adam (fused where this torch has it for the device) with FlatAdam's ``zero_grad`` and
    ``clip_grad_norm``, for parameters that do not share one device and dtype."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float):
        params = list(params)
        try:
            super().__init__(params, lr=lr, eps=EPS, fused=True)
        except (RuntimeError, TypeError):
            super().__init__(params, lr=lr, eps=EPS)
        self.params = params

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:  # without Optimizer.zero_grad's profiler record per call
            p.grad = None

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm(self.params, max_norm)


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
