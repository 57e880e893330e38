"""The one second form of the policy's math: a stateless policy over a float32 Box (CartPole's kind of observation).

``Policy.step_function`` and ``Policy.forward_function`` stand for ``forward_eval`` and ``forward`` and are the plain
modules everywhere but here. For the composition this module names (``applies``) they are these functions instead:
the same ops in the same order (so the same bits and gradients, ``tests/test_rollout_step_function.py``), bound
once to the modules' parameters, without module calls, branches and lookups, and on the rollout without
allocations (``out=`` buffers, in-place activations). A rollout step there is a handful of ops on a few rows,
where the module calls cost more than the ops. Over whole runs on 8 Numba CartPoles at benchmarks/train.py's setting
(32 iterations of 128 steps, load 0.6) these forms gave 44,985 agent steps/s and the plain modules 34,582 (1.30x: the
bar issue 38 sets for a second form, and what keeps packrl at >= 4x the CleanRL-style loop there: 4.59x against
3.53x); benchmarks/model_forms.py, which counts PPO's construction, 1.03-1.26x under load. On packed rows (the
gridworld, MiniGrid) the encoder's own work dominates: 0.99-1.02x, so the modules run there.

The composition: ``LayoutEncoder`` whose input is its float32 Box passed through as itself, read by the flat features
alone (no symlog), then ``MLP`` or ``TwinMLP``, then packrl's ``Decoder`` with its ``ActionHead`` and ``ValueHead``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from packrl.models.encoders import NORMALIZED_CLIP, LayoutEncoder
from packrl.models.heads import ActionHead, Decoder, ValueHead
from packrl.models.networks import MLP, TwinMLP, activation

IN_PLACE = {torch.relu: torch.relu_, torch.tanh: torch.tanh_}
"""Each activation function's in-place twin: the rollout form applies it to buffers it owns."""

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Forward = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def applies(encoder: object, network: object, decoder: object, x: torch.Tensor) -> bool:
    """Whether the parts (exactly packrl's classes, none of a subclass that may compute otherwise) and the input
    ``x`` (a batch of the encoder's float32 Box itself) are this module's composition."""
    return (type(encoder) is LayoutEncoder and type(network) in (MLP, TwinMLP) and type(decoder) is Decoder
            and type(decoder.actor) is ActionHead and type(decoder.critic) is ValueHead and encoder.reads_flat_box(x))


def step_function(encoder: LayoutEncoder, network: MLP | TwinMLP, decoder: Decoder, x: torch.Tensor) -> Step:
    """``step(x, values) -> logits``: ``forward_eval`` for batches shaped as ``x``, run without autograd. The values
    are written into ``values`` ``(rows, 1)``, the logits into a buffer that the next call overwrites. It holds
    views of the weights, so it is made again after their storage moves (PPO makes one per rollout)."""
    rows = x.shape[0]
    encode, layers = _encoder_step(encoder, x), _network_step(network, rows)
    actor, critic = _actor_step(decoder.actor, rows), _critic_step(decoder.critic)
    if type(network) is TwinMLP:
        def step(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            hidden = layers(encode(x))
            critic(hidden[1], values)
            return actor(hidden[0])
    else:
        def step(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            hidden = layers(encode(x))
            critic(hidden, values)
            return actor(hidden)
    return step


def forward_function(encoder: LayoutEncoder, network: MLP | TwinMLP, decoder: Decoder, x: torch.Tensor) -> Forward:
    """``forward(x) -> (logits (B, T, L), values (B, T))``: ``forward`` for batches shaped as ``x`` ``(B, T, ...)``,
    for training (autograd records the same ops as usual)."""
    encode = _encoder_forward(encoder, x.reshape((-1,) + tuple(x.shape[2:])))
    layers, twin, actor, critic = network.sequence, type(network) is TwinMLP, decoder.actor, decoder.critic
    discrete = actor.spec.num_continuous == 0
    actor_weight, actor_bias = (actor.discrete.weight, actor.discrete.bias) if discrete else (None, None)
    critic_weight, critic_bias = critic.linear.weight, critic.linear.bias

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = x.shape[:2]
        hidden, _ = layers(encode(x.reshape((b * t,) + tuple(x.shape[2:]))), ())
        acting, valuing = (hidden[0], hidden[1]) if twin else (hidden, hidden)
        logits = F.linear(acting, actor_weight, actor_bias) if discrete else actor.forward(acting)
        values = F.linear(valuing, critic_weight, critic_bias).squeeze(-1)
        return logits.reshape(b, t, -1), values.reshape(b, t)
    return forward


# ---------------------------------------------------------------- the parts, as their modules compute them

def _encoder_step(encoder: LayoutEncoder, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The encoder's scale, clamp when normalizing, projection and activation, into buffers of its own."""
    shift, scale, size, normalize = encoder.flat_shift, encoder.flat_scale, encoder.flat_size, encoder.normalize
    linear = encoder.project[0]
    act, weight_t, bias = IN_PLACE[activation(encoder.activation)[0]], linear.weight.t(), linear.bias
    features, out = weight_t.new_empty((x.shape[0], size)), weight_t.new_empty((x.shape[0], encoder.hidden))
    flat = x.ndim == 2  # (B, size) already: no reshape to dispatch

    def encode(x: torch.Tensor) -> torch.Tensor:
        torch.addcmul(shift, x if flat else x.reshape(-1, size), scale, out=features)
        if normalize:
            features.clamp_(-NORMALIZED_CLIP, NORMALIZED_CLIP)
        return act(torch.addmm(bias, features, weight_t, out=out))  # F.linear's op for 2-d input
    return encode


def _encoder_forward(encoder: LayoutEncoder, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The encoder's ``forward`` on its flat Box, without its branches and lookups (autograd as usual)."""
    shift, scale, size, normalize = encoder.flat_shift, encoder.flat_scale, encoder.flat_size, encoder.normalize
    act, linear = activation(encoder.activation)[0], encoder.project[0]
    weight, bias = linear.weight, linear.bias
    flat = x.ndim == 2

    def encode(x: torch.Tensor) -> torch.Tensor:
        features = torch.addcmul(shift, x if flat else x.reshape(-1, size), scale)
        if normalize:
            features = features.clamp(-NORMALIZED_CLIP, NORMALIZED_CLIP)
        return act(F.linear(features, weight, bias))
    return encode


def _network_step(network: MLP | TwinMLP, rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The network's layers for ``rows`` rows, into buffers of its own."""
    act = IN_PLACE[activation(network.activation)[0]]
    if type(network) is TwinMLP:
        width, weight_t, bias = network.hidden_size, network.weight.transpose(1, 2), network.bias
        both_out = weight_t.new_empty((2, rows, width))

        def twin(x: torch.Tensor) -> torch.Tensor:
            both = x.reshape(-1, 2, width).transpose(0, 1)  # (2, N, hidden): a view, no copy
            return act(torch.baddbmm(bias, both, weight_t, out=both_out))
        return twin
    layers = tuple((layer.weight.t(), layer.bias, layer.weight.new_empty((rows, layer.out_features)))
                   for layer in network.linears)

    def mlp(x: torch.Tensor) -> torch.Tensor:
        for weight_t, bias, out in layers:  # what F.linear computes for 2-d input: addmm(bias, x, weight.t())
            x = act(torch.addmm(bias, x, weight_t, out=out))
        return x
    return mlp


def _actor_step(actor: ActionHead, rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Discrete logits into a buffer of its own; a head with continuous parts runs as its module."""
    if actor.spec.num_continuous:
        return actor.forward
    weight_t, bias = actor.discrete.weight.t(), actor.discrete.bias
    out = weight_t.new_empty((rows, weight_t.shape[1]))
    return lambda hidden: torch.addmm(bias, hidden, weight_t, out=out)  # F.linear's op for 2-d input


def _critic_step(critic: ValueHead) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``step(hidden, out)``: the values written into ``out`` ``(rows, 1)`` (a column of storage)."""
    weight_t, bias = critic.linear.weight.t(), critic.linear.bias
    return lambda hidden, out: torch.addmm(bias, hidden, weight_t, out=out)  # F.linear's op for 2-d input
