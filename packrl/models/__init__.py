"""Policies over packed structured observations: Policy(encoder, network, decoder).

See DESIGN.md ("Models") and ``packrl.models.policy`` for the interface the trainer relies on.
"""
from packrl.models.compat import LegacyDecoder, LSTMWrapper
from packrl.models.distributions import ActionSpec, Bounds, Hybrid, MultiCategorical, SquashedNormal, apply_mask
from packrl.models.encoders import (
    DiscreteEmbedding,
    Flat,
    ImageEncoder,
    LayoutEncoder,
    NativeEncoder,
    TextEncoder,
    impala_cnn,
    leaf_tensors,
    nature_cnn,
    small_cnn,
)
from packrl.models.grouped import GroupedPolicy
from packrl.models.heads import ActionHead, Decoder, ValueHead
from packrl.models.networks import GRU, LSTM, MLP, MinGRU, TwinMLP, linear_scan, make_network
from packrl.models.policy import ActionMask, Policy

__all__ = [
    "ActionHead", "ActionMask", "ActionSpec", "Bounds", "Decoder", "DiscreteEmbedding", "Flat", "GRU", "GroupedPolicy",
    "Hybrid",
    "ImageEncoder", "LSTM", "LSTMWrapper", "LayoutEncoder", "LegacyDecoder", "MLP", "MinGRU", "TwinMLP", "MultiCategorical",
    "NativeEncoder", "Policy", "SquashedNormal", "TextEncoder", "ValueHead", "apply_mask", "impala_cnn",
    "leaf_tensors", "linear_scan", "make_network", "nature_cnn", "small_cnn",
]
