"""Policy(encoder, network, decoder): packed observation rows -> (logits, values, state).

- ``initial_state(batch_size, device)``: the network's zero state (a tuple of tensors; ``()`` for MLP).
- ``forward_eval(x (B, nbytes), state, done=None) -> (logits (B, L), values (B,), state)``: one
  rollout step.
- ``forward(x (B, T, nbytes), state, done=None) -> (logits (B, T, L), values (B, T), state)``:
  training over time.

``done`` (bool ``(B,)`` or ``(B, T)``) holds the terminals | truncations the env returned together
with ``x``: those rows begin a new episode, so their recurrent state is zeroed before ``x`` is read
(vector envs put the next episode's first observation in ``observations`` on the step that ends
one). Calling ``forward_eval`` T times equals one ``forward`` over T. When the observation layout
has an action-mask leaf, its nonzero entries are the allowed choices and the logits of the others
are masked (probability 0). ``policy.decoder.distribution(logits)`` gives ``sample``,
``log_prob``, ``entropy``; ``policy.decoder.to_numpy(action)`` gives the arrays ``env.step`` takes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from gymnasium import spaces
from torch import nn

from packrl.config import PolicyConfig
from packrl.emulation.actions import ActionLayout
from packrl.emulation.layout import Layout
from packrl.emulation.values import format_path
from packrl.errors import EmulationError
from packrl.models import fast_forms
from packrl.models.encoders import LayoutEncoder
from packrl.models.heads import ActionHead, Decoder, ValueHead
from packrl.models.networks import MLP, State, TwinMLP, make_network
from packrl.torch_private import forward_hooks_present


class ActionMask(nn.Module):
    """Reads the action-mask leaf at ``path`` from packed rows as a bool ``(..., width)`` tensor.

    One-byte leaves (bool, uint8, int8) are compared on their raw bytes, a form every backend
    compiles (no bool bitcast); wider dtypes are viewed in their own dtype first."""

    def __init__(self, layout: Layout, path: tuple):
        super().__init__()
        leaves = [leaf for leaf in layout.leaves if leaf.path == tuple(path)]
        if len(leaves) != 1 or leaves[0].kind not in ("box", "multibinary"):
            raise EmulationError(f"action mask {format_path(tuple(path))} must be one Box or MultiBinary leaf of the observation")
        leaf = leaves[0]
        self.start, self.end = leaf.offset, leaf.offset + leaf.nbytes
        self.itemsize = leaf.dtype.itemsize
        self.dtype_name = leaf.dtype.name
        self.width = int(np.prod(leaf.shape))
        self.path = tuple(path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raw = x[..., self.start:self.end]
        if self.itemsize > 1:
            raw = raw.view(getattr(torch, self.dtype_name))
        return raw != 0


CRITICS = ("shared", "separate")


class Policy(nn.Module):
    """Encoder -> network -> decoder, with an optional action-mask reader (see the module doc).

    ``row_bytes`` trims wider rows to this policy's layout (heterogeneous envs pad every row to
    the widest group's layout). With a ``TwinMLP`` network (``critic="separate"``) the actor head reads the
    network's first output and the critic head its second; otherwise both read the same output."""

    def __init__(self, encoder: nn.Module, network: nn.Module, decoder: Decoder,
                 action_mask: ActionMask | None = None, row_bytes: int | None = None):
        super().__init__()
        self.encoder, self.network, self.decoder = encoder, network, decoder
        self.action_mask = action_mask
        self.row_bytes = row_bytes
        self.twin = isinstance(network, TwinMLP)
        if self.twin and not isinstance(decoder, Decoder):
            raise EmulationError("a TwinMLP network (a separate critic) needs packrl's Decoder, whose actor and "
                                 "critic heads read its two outputs")
        spec = getattr(decoder, "spec", None)
        if action_mask is not None and spec is not None and action_mask.width != spec.mask_size:
            raise EmulationError(f"action mask {format_path(action_mask.path)} has {action_mask.width} entries, "
                                 f"the action space has {spec.mask_size} discrete choices")

    # ------------------------------------------------------------ construction

    @classmethod
    def from_layouts(cls, observation: Layout, action: ActionLayout | spaces.Space, network: str = "mlp",
                     hidden: int = 128, action_mask: tuple | None = None, overrides: dict | None = None,
                     log_std_init: float = 0.0, row_bytes: int | None = None, critic: str = "shared",
                     normalize_observations: bool = False, squash_actions: bool = True,
                     activation: str = "relu") -> "Policy":
        """A LayoutEncoder, a named network ("mlp", "lstm", "gru", "mingru") and a Decoder; ``critic="separate"``
        (mlp only) builds a second encoder and network of the same shape for the value head.
        ``normalize_observations``: the encoder keeps running statistics of its flat features and normalizes them
        (``update_normalization``, which PPO calls after each update). ``squash_actions=False``: Box actions are an
        unbounded Gaussian clipped at the env (``ActionSpec``). ``activation``: the nonlinearity of the encoder's
        projection and the MLP layers, "relu" or "tanh" (CleanRL's and SB3's continuous-control networks)."""
        if critic not in CRITICS:
            raise EmulationError(f"critic must be one of {list(CRITICS)}, not {critic!r}")
        if critic == "separate" and network != "mlp":
            raise EmulationError(f"critic='separate' needs network='mlp' (not {network!r}): a recurrent core's state "
                                 "belongs to one trunk")
        if critic == "separate":  # one projection to [actor | critic] features, then a TwinMLP
            encoder = LayoutEncoder(observation, 2 * hidden, overrides, normalize_observations, activation)
            with torch.no_grad():  # each half starts as its own projection would (orthogonal per path)
                for half in encoder.project[0].weight.split(hidden):
                    nn.init.orthogonal_(half, float(np.sqrt(2)))
            net: nn.Module = TwinMLP(hidden, activation)
        else:
            encoder = LayoutEncoder(observation, hidden, overrides, normalize_observations, activation)
            net = make_network(network, encoder.output_size, hidden, activation)
        decoder = Decoder(action, net.hidden_size, log_std_init, squash_actions)
        mask = ActionMask(observation, action_mask) if action_mask is not None else None
        return cls(encoder, net, decoder, mask, row_bytes)

    @classmethod
    def from_env(cls, env: Any, config: PolicyConfig | None = None, *, group: int | None = None,
                 use_action_mask: bool = True, **settings: Any) -> "Policy":
        """The policy of an emulated env (``env.emulated``: its observation Layout, ActionLayout and action-mask
        path) as ``config`` describes it (``packrl.config.PolicyConfig``, the one place a policy setting's
        default is written), ``settings`` (its field names: ``network=``, ``hidden=``, ...) replacing fields.
        ``overrides`` name leaves by tuple or as ``'a/0/b'``. An env whose agents fall into several groups
        (different spaces) needs ``group=i`` (that group's rows are ``env.emulated.groups[i].rows``), or
        ``per_group``."""
        config = dataclasses.replace(config or PolicyConfig(), **settings)
        emulated = env.emulated
        if group is None:
            if emulated.heterogeneous:
                raise EmulationError(
                    f"this env has {len(emulated.groups)} agent groups with different spaces "
                    f"({[g.agents for g in emulated.groups]}); build one policy per group with "
                    "Policy.per_group(env) or Policy.from_env(env, group=i)")
            group = 0
        g = emulated.groups[group]
        row_bytes = g.observation.nbytes if g.observation.nbytes != emulated.nbytes else None
        overrides = {_leaf_path(path): choice for path, choice in (config.overrides or {}).items()}
        return cls.from_layouts(g.observation, g.action, config.network, config.hidden,
                                g.action_mask if use_action_mask else None, overrides or None, config.log_std_init,
                                row_bytes, config.critic, config.normalize_observations, config.squash_actions,
                                config.activation)

    @classmethod
    def per_group(cls, env: Any, config: PolicyConfig | None = None, **settings: Any) -> nn.ModuleList:
        """One policy per agent group of ``env.emulated``; policy i acts for rows ``groups[i].rows``."""
        return nn.ModuleList(cls.from_env(env, config, group=i, **settings) for i in range(len(env.emulated.groups)))

    # ------------------------------------------------------------ running

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> State:
        return self.network.initial_state(batch_size, device)

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Rows ``(N, nbytes)`` -> encoder features and the decoder's context (the action mask)."""
        if self.row_bytes is not None:
            x = x[..., : self.row_bytes]
        mask = self.action_mask(x) if self.action_mask is not None else None
        return self.encoder(x), mask

    def heads(self, hidden: torch.Tensor, context: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, values) from the network's output (a TwinMLP's: the actor's features, then the critic's)."""
        if self.twin:
            return self.decoder.actor(hidden[0], context), self.decoder.critic(hidden[1])
        return self.decoder(hidden, context)

    def forward_eval(self, x: torch.Tensor, state: State = (), done: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One rollout step: ``x (B, ...)`` -> ``(logits (B, L), values (B,), state)``."""
        features, context = self.features(x)
        hidden, state = self.network.step(features, state, done)
        logits, values = self.heads(hidden, context)
        return logits, values, state

    def step_function(self, x: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """``forward_eval`` of a stateless policy for batches shaped and typed as ``x``, run without autograd:
        ``step(x, values) -> logits`` writes the values into ``values`` ``(rows, 1)`` and returns the logits, the bits
        ``forward_eval`` gives. Over a float32 Box it is ``packrl.models.fast_forms``' form (its logits in a buffer that
        the next call overwrites); otherwise ``forward_eval`` itself. None where the policy is not packrl's own
        stateless one: a recurrent network, an action mask, trimmed rows, a component or policy class of the user's
        own, or a module with forward hooks."""
        if not self._own_stateless_parts(Policy.forward_eval):
            return None
        if fast_forms.applies(self.encoder, self.network, self.decoder, x):
            return fast_forms.step_function(self.encoder, self.network, self.decoder, x)
        forward_eval = self.forward_eval

        def step(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            logits, value, _ = forward_eval(x)
            values.copy_(value.unsqueeze(-1))
            return logits
        return step

    def forward_function(self, x: torch.Tensor) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
        """``forward`` of a stateless policy for batches shaped and typed as ``x`` ``(B, T, ...)``, for training:
        ``forward(x) -> (logits (B, T, L), values (B, T))``, the bits and gradients of ``forward``: over a float32
        Box ``packrl.models.fast_forms``' form, otherwise ``forward`` itself. None where ``step_function`` is
        None but for an overridden ``forward_eval``."""
        if not self._own_stateless_parts(Policy.forward):
            return None
        flat = x.reshape((-1,) + tuple(x.shape[2:]))
        if fast_forms.applies(self.encoder, self.network, self.decoder, flat):
            return fast_forms.forward_function(self.encoder, self.network, self.decoder, x)
        forward = self.forward
        return lambda x: forward(x)[:2]

    def _own_stateless_parts(self, method: Any) -> bool:
        """Whether ``method`` (``Policy.forward_eval`` or ``Policy.forward``) is packrl's, over packrl's own
        stateless components, with no action mask, trimmed rows or forward hooks (which a form that bypasses module
        calls would skip)."""
        return (getattr(type(self), method.__name__) is method and self.action_mask is None
                and self.row_bytes is None and type(self.encoder) is LayoutEncoder
                and type(self.network) in (MLP, TwinMLP) and type(self.decoder) is Decoder
                and type(self.decoder.actor) is ActionHead and type(self.decoder.critic) is ValueHead
                and not forward_hooks_present(self))

    def forward(self, x: torch.Tensor, state: State = (), done: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """Training over time: ``x (B, T, ...)`` -> ``(logits (B, T, L), values (B, T), state)``."""
        b, t = x.shape[:2]
        features, context = self.features(x.reshape((b * t,) + tuple(x.shape[2:])))
        if type(self.network) in (MLP, TwinMLP):  # row-wise: no (B, T) round trip (each view is a node to backpropagate)
            hidden, state = self.network.sequence(features, state, done)
        else:
            hidden, state = self.network.sequence(features.reshape(b, t, -1), state, done)
            hidden = hidden.reshape(b * t, -1)
        logits, values = self.heads(hidden, context)
        return logits.reshape(b, t, -1), values.reshape(b, t), state

    def update_normalization(self, x: torch.Tensor) -> None:
        """Merge observations ``x`` (rows, or the Box's own rows) into a normalizing encoder's statistics; else nothing."""
        update = getattr(self.encoder, "update_normalization", None)
        if update is not None:
            update(x[..., : self.row_bytes] if self.row_bytes is not None else x)

    def average_normalization(self, world: int) -> None:
        """Average a normalizing encoder's statistics over ``world`` ranks (torch.distributed), so their weights and
        buffers stay identical."""
        encoder = self.encoder
        if getattr(encoder, "normalize", False) and encoder.flat_size:
            for buffer in (encoder.obs_mean, encoder.obs_var):
                dist.all_reduce(buffer)
                buffer.div_(world)
            encoder.refresh_normalization()

    def distribution(self, logits: torch.Tensor) -> Any:
        """Shorthand for ``self.decoder.distribution(logits)``."""
        return self.decoder.distribution(logits)


def _leaf_path(path: Any) -> Any:
    """A leaf path of ``PolicyConfig.overrides``: a tuple as it is, ``'a/0/b'`` as ``('a', 0, 'b')``."""
    if not isinstance(path, str):
        return path
    return tuple(int(part) if part.isdigit() else part for part in path.split("/"))
