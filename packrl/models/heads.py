"""Decoders: hidden features -> (flat logits, values), with the action mask applied.

``Decoder(action, hidden)`` works for every ActionLayout kind (discrete, multidiscrete,
continuous, hybrid); ``decoder.distribution(logits)`` gives the distribution the PPO trainer
samples from and scores, and ``decoder.to_numpy(action)`` the arrays ``env.step`` takes.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

from packrl.emulation.actions import ActionLayout
from packrl.errors import EmulationError
from packrl.models.distributions import ActionSpec, apply_mask


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights, constant bias (the PPO implementation-details default)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def as_action_layout(action: ActionLayout | spaces.Space) -> ActionLayout:
    return action if isinstance(action, ActionLayout) else ActionLayout(action)


class ActionHead(nn.Module):
    """Linear logits for the discrete branches, a Gaussian mean per continuous dimension and a
    state-independent log standard deviation (a parameter, as in CleanRL's continuous PPO)."""

    def __init__(self, action: ActionLayout | spaces.Space, hidden: int, log_std_init: float = 0.0,
                 squash: bool = True):
        super().__init__()
        self.spec = ActionSpec(as_action_layout(action), squash)
        d, m = self.spec.num_discrete, self.spec.num_continuous
        self.discrete = layer_init(nn.Linear(hidden, d), std=0.01) if d else None
        self.mean = layer_init(nn.Linear(hidden, m), std=0.01) if m else None
        self.log_std = nn.Parameter(torch.full((m,), float(log_std_init))) if m else None

    @property
    def logits_size(self) -> int:
        return self.spec.logits_size

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.spec.num_continuous == 0:  # discrete only (the common case): one linear, then the mask
            return apply_mask(F.linear(hidden, self.discrete.weight, self.discrete.bias), mask)
        parts = []
        if self.discrete is not None:
            parts.append(apply_mask(self.discrete(hidden), mask))
        elif mask is not None:
            raise EmulationError("an action mask was given but the action space has no discrete choices")
        if self.mean is not None:
            mean = self.mean(hidden)
            parts += [mean, self.log_std.expand_as(mean)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, -1)


class ValueHead(nn.Module):
    """One value per row: ``(..., hidden) -> (...)``."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = layer_init(nn.Linear(hidden, 1), std=1.0)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.linear.weight, self.linear.bias).squeeze(-1)


class Decoder(nn.Module):
    """Actor and critic over the network's output.

    ``forward(hidden, mask=None) -> (logits (..., logits_size), values (...))``; ``mask`` is the
    action-mask leaf (``(..., sum(nvec))``, nonzero = allowed). ``distribution(logits)`` returns an
    object with ``sample()``, ``log_prob(action)``, ``entropy()`` and ``mode()``, whose actions are
    in the env's policy-facing form; ``to_numpy(action)`` makes them ready for ``env.step``."""

    def __init__(self, action: ActionLayout | spaces.Space, hidden: int, log_std_init: float = 0.0,
                 squash: bool = True):
        super().__init__()
        self.actor = ActionHead(action, hidden, log_std_init, squash)
        self.critic = ValueHead(hidden)
        self.spec = self.actor.spec

    @property
    def logits_size(self) -> int:
        return self.spec.logits_size

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(hidden, mask), self.critic(hidden)

    def distribution(self, logits: torch.Tensor) -> Any:
        return self.spec.distribution(logits)

    def to_numpy(self, action: Any) -> Any:
        return self.spec.to_numpy(action)
