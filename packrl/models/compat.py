"""Older policies (``encode_observations`` / ``decode_actions``) inside the Policy interface.

A policy written in the older style has

- ``encode_observations(obs) -> hidden`` or ``-> (hidden, lookup)``;
- ``decode_actions(hidden, lookup) -> (logits, value)`` (or ``decode_actions(hidden)`` when
  ``encode_observations`` returned no lookup), where ``logits`` is a tensor (Discrete), a list of
  per-branch tensors (MultiDiscrete), or a ``torch.distributions.Normal`` (Box, its ``loc`` the
  latent mean and its ``scale`` the standard deviation).

``LSTMWrapper(policy, action, input_size, hidden_size)`` puts a recurrent network between the two
(the LSTMWrapper pattern), so such a policy gets ``initial_state`` / ``forward_eval`` / ``forward``,
episode resets and ``decoder.distribution`` unchanged. ``obs`` is the batch of packed uint8 rows;
call ``packrl.nativize.nativize(obs, layout)`` inside ``encode_observations`` to get the leaves.
"""
from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from packrl.emulation.actions import ActionLayout
from packrl.errors import EmulationError
from packrl.models.distributions import ActionSpec
from packrl.models.heads import as_action_layout
from packrl.models.networks import make_network
from packrl.models.policy import Policy


class LegacyDecoder(nn.Module):
    """Turns a legacy ``decode_actions`` output into packrl's flat logits and values."""

    def __init__(self, action: ActionLayout | spaces.Space):
        super().__init__()
        self.spec = ActionSpec(as_action_layout(action))

    @property
    def logits_size(self) -> int:
        return self.spec.logits_size

    def convert(self, logits: Any, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(logits, torch.distributions.Normal):
            flat = torch.cat([logits.loc, logits.scale.log()], -1)
        elif isinstance(logits, (list, tuple)):
            flat = torch.cat(list(logits), -1)
        else:
            flat = logits
        if flat.shape[-1] != self.spec.logits_size:
            raise EmulationError(f"decode_actions returned logits of width {flat.shape[-1]}; the "
                                 f"{self.spec.kind} action space needs {self.spec.logits_size}")
        return flat, value.reshape(flat.shape[:-1])

    def distribution(self, logits: torch.Tensor) -> Any:
        return self.spec.distribution(logits)

    def to_numpy(self, action: Any) -> Any:
        return self.spec.to_numpy(action)


class LSTMWrapper(Policy):
    """An older-style policy with a recurrent core ("lstm", "gru", "mingru"; "mlp" for none).

    ``action`` is the env's ActionLayout (``env.emulated.action``) or its action space."""

    def __init__(self, policy: nn.Module, action: ActionLayout | spaces.Space, input_size: int = 128,
                 hidden_size: int = 128, network: str = "lstm"):
        for name in ("encode_observations", "decode_actions"):
            if not callable(getattr(policy, name, None)):
                raise TypeError(f"{type(policy).__name__} has no {name}(); LSTMWrapper needs both "
                                "encode_observations(obs) and decode_actions(hidden[, lookup])")
        # the legacy policy is the encoder module (registered once, so its weights appear once)
        super().__init__(policy, make_network(network, input_size, hidden_size), LegacyDecoder(action))

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        out = self.encoder.encode_observations(x)
        if isinstance(out, tuple) and len(out) == 2:
            return out
        return out, _NO_LOOKUP

    def heads(self, hidden: torch.Tensor, context: Any) -> tuple[torch.Tensor, torch.Tensor]:
        legacy = self.encoder
        out = legacy.decode_actions(hidden) if context is _NO_LOOKUP else legacy.decode_actions(hidden, context)
        return self.decoder.convert(*out)


_NO_LOOKUP = object()
