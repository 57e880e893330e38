"""Encoders from packed uint8 rows to features, driven by the observation Layout.

``LayoutEncoder(layout, hidden)`` nativizes the rows (``packrl.nativize``), embeds each leaf by
its kind and concatenates the embeddings into one ``Linear + ReLU`` projection to ``hidden``:

- float, integer and bool Boxes, MultiBinary: flattened, scaled to [-1, 1] by finite bounds
  (integers without bounds go through symlog, unbounded floats pass unchanged);
- images (3-d Boxes of uint8 or bool, HxWxC or CxHxW): a conv net (``"cnn"`` for small grids,
  ``"nature"`` for 36 px and more; ``"impala"`` on request; ``"cells"`` for grids of codes such as
  MiniGrid's, each code embedded);
- Discrete and MultiDiscrete: embeddings of ``value - start``;
- Text and bounded strings: ``"words"``, bags of hashed words and word pairs (``WordEncoder``), or
  ``"embedding"``, character embeddings mean-pooled over the string's length.
- Text next to a grid of codes (a MiniGrid mission and its ``"cells"`` image): the text's features also steer the
  grid's encoder (FiLM, ``CellEncoder.condition_on``), so a mission that names its target changes what the grid
  encoder sees; ``LayoutEncoder(..., condition=False)`` only concatenates them.

``overrides={path: choice}`` changes one leaf: ``"drop"`` (or None) leaves it out, a name
(``"flat"``, ``"embedding"``, ``"cnn"``, ``"nature"``, ``"impala"``, ``"cells"``, ``"words"``) picks a built-in encoder, and an
``nn.Module`` is used as is (it gets the leaf tensor ``(B, *shape)``, or the codec's view of its fields for a leaf of
several: ``(chars, length)`` for strings,
and needs an ``output_size`` attribute). ``NativeEncoder`` runs a plain module on the nativized
structure instead.

Bool leaves are read as their raw uint8 bytes (0 or 1): Inductor on CPU (torch 2.13) fails to
compile ``uint8.view(torch.bool).float()``, and the raw bytes carry the same values.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from packrl.emulation.layout import Layout, Leaf
from packrl.emulation.values import format_path
from packrl.errors import EmulationError
from packrl.models.heads import layer_init
from packrl.models.networks import activation
from packrl.nativize import TORCH_DTYPES, check_rows, leaf_view, leaf_views, nativize, torch_dtype
from packrl.running_moments import merge_moments

EMBED_DIM = 16
"""Width of each Discrete / MultiDiscrete / character embedding."""

MAX_EMBEDDING = 65536
"""A Discrete with more choices than this is fed as one scaled number instead of an embedding."""

INT_SCALE_LIMIT = 2**24
"""Integer leaves whose bounds span more than this (counters, full int32/int64 ranges) get symlog."""

FINITE_LIMIT = 1e18
"""Bounds of larger magnitude count as infinite when scaling (float32 max is a common stand-in for inf)."""


NORMALIZED_CLIP = 10.0
"""Normalized observations are clipped to +-this (CleanRL's and SB3's VecNormalize clip_obs)."""

NORMALIZE_EPS = 1e-8


# ---------------------------------------------------------------- leaf encoders

class Flat(nn.Module):
    """A numeric leaf (every field of it) flattened to floats and scaled to [-1, 1] where its bounds are finite.
    Integers whose bounds span more than INT_SCALE_LIMIT get symlog; unbounded floats pass as they are.
    ``Flat(leaf)`` or ``Flat([field leaves of one path])``: the fields' elements side by side, in that order."""

    def __init__(self, leaf: Leaf | list[Leaf]):
        super().__init__()
        fields = [leaf] if isinstance(leaf, Leaf) else list(leaf)
        scale, shift, symlog = (np.concatenate(parts) for parts in zip(*(_flat_constants(f) for f in fields)))
        self.output_size = int(scale.size)
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("shift", torch.as_tensor(shift, dtype=torch.float32))
        self.any_symlog = bool(symlog.any())
        self.register_buffer("symlog", torch.as_tensor(symlog))

    def raw(self, x: torch.Tensor | tuple) -> torch.Tensor:
        """The leaf as floats before the affine scaling (symlog already applied where it is due)."""
        parts = x if isinstance(x, tuple) else (x,)
        flat = [p.reshape(p.shape[0], -1) for p in parts]
        x = (flat[0] if len(flat) == 1 else torch.cat([p.float() for p in flat], -1)).float()
        if self.any_symlog:
            x = torch.where(self.symlog, torch.sign(x) * torch.log1p(x.abs()), x)
        return x

    def forward(self, x: torch.Tensor | tuple) -> torch.Tensor:
        return torch.addcmul(self.shift, self.raw(x), self.scale)


def _flat_constants(leaf: Leaf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale, shift, symlog) per element of one field: ``x * scale + shift`` is ``(x - center) / half``."""
    low, high = _bounds(leaf)
    finite = (np.abs(low) < FINITE_LIMIT) & (np.abs(high) < FINITE_LIMIT)
    if leaf.dtype.kind in "iu":
        finite &= (high - low) <= INT_SCALE_LIMIT
    low, high = np.where(finite, low, 0.0), np.where(finite, high, 0.0)
    half = np.where(finite & (high > low), (high - low) / 2, 1.0)
    symlog = ~finite if leaf.dtype.kind in "iu" else np.zeros_like(finite)
    return (np.where(finite, 1.0 / half, 1.0).reshape(-1), np.where(finite, -(low + high) / 2 / half, 0.0).reshape(-1),
            np.asarray(symlog, bool).reshape(-1))


class DiscreteEmbedding(nn.Module):
    """Discrete(n, start) or MultiDiscrete(nvec, start): one embedding table, offset per element.

    Indices are clamped into range: rows of absent agents are all zeros, which is outside
    ``[start, start + n)`` when ``start > 0``, and an out-of-range index would abort a CUDA kernel."""

    def __init__(self, nvec: np.ndarray, start: np.ndarray, dim: int = EMBED_DIM):
        super().__init__()
        nvec, start = np.asarray(nvec, np.int64).reshape(-1), np.asarray(start, np.int64).reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        # index = clamp(x, start, start + n - 1) + (offset - start): two ops, no overflow on int64 extremes
        self.register_buffer("start", torch.as_tensor(start))
        self.register_buffer("stop", torch.as_tensor(start + nvec - 1))
        self.register_buffer("shift", torch.as_tensor(offsets - start))
        self.table = nn.Embedding(int(nvec.sum()), dim)
        self.output_size = dim * len(nvec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2:
            x = x.reshape(x.shape[0], -1)
        if x.dtype != torch.int64:
            x = x.long()
        index = torch.clamp(x, self.start, self.stop) + self.shift
        return self.table(index).reshape(x.shape[0], -1)


class ScaledIndex(nn.Module):
    """A Discrete too large to embed: ``(value - start) / (n - 1)`` as one float."""

    def __init__(self, n: int, start: int):
        super().__init__()
        self.n, self.start = n, start
        self.output_size = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.reshape(x.shape[0], -1).long() - self.start).float() / max(self.n - 1, 1)


class TextEncoder(nn.Module):
    """Characters embedded and averaged over the first ``length`` positions."""

    def __init__(self, vocab: int, dim: int = EMBED_DIM):
        super().__init__()
        self.table = nn.Embedding(vocab, dim)
        self.vocab = vocab
        self.output_size = dim

    def forward(self, text: Any) -> torch.Tensor:
        """``text``: a string leaf's ``(chars, length)`` view."""
        chars, length = text.chars, text.length.reshape(-1, 1)
        emb = self.table(chars.long().clamp(0, self.vocab - 1))  # (B, L, dim)
        positions = torch.arange(chars.shape[-1], device=chars.device)
        keep = (positions < length).unsqueeze(-1).to(emb.dtype)
        return (emb * keep).sum(-2) / length.clamp(min=1).to(emb.dtype)


class WordEncoder(nn.Module):
    """A string read as words: each word (a run of characters between separators) is hashed, characters in
    order, into one of ``buckets`` embeddings, each pair of neighbouring words too (same table, its own
    hash), and the two bags are averaged over the string's words and pairs. Words keep what a MiniGrid
    mission says ("go to the red door": the colour is one whole token, not 3 of 19 averaged characters),
    pairs keep which word goes with which ("the red ball", "the blue key"). Colliding hashes share an
    embedding: GoToDoor's 10 words and 14 pairs in 1024 buckets expect 0.3 colliding pairs. The table stays
    small because Adam updates every row of it each minibatch: two tables of 4096 x 32 doubled the update
    time on MiniGrid."""

    PRIME, MODULUS = 257, 1_000_003
    graph_safe = False  # reads the longest string's length on the host: a rollout with it is not a CUDA graph

    def __init__(self, separators: list[int], vocab: int, max_length: int, dim: int = EMBED_DIM, buckets: int = 1024):
        super().__init__()
        self.buckets = buckets
        is_separator = torch.zeros(vocab, dtype=torch.bool)
        is_separator[separators] = True
        self.register_buffer("is_separator", is_separator)
        self.last_code = vocab - 1
        powers = [1]
        for _ in range(max_length - 1):
            powers.append(powers[-1] * self.PRIME % self.MODULUS)
        self.register_buffer("powers", torch.as_tensor(powers, dtype=torch.long))
        self.table = nn.Embedding(buckets, dim)  # words and word pairs share it: one lookup, one backward
        self.output_size = 2 * dim

    def word_hashes(self, text: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hashes (B, W), words (B,))``: each word's hash in ``[0, MODULUS)``, in order, and the word count."""
        chars, length = text.chars.long().clamp(0, self.last_code), text.length.reshape(-1, 1).long()
        if not torch.compiler.is_compiling():  # only up to the longest string of the batch
            chars = chars[:, :max(int(length.max()), 1)]
        positions = torch.arange(chars.shape[-1], device=chars.device)
        sep = (positions >= length) | self.is_separator[chars]
        before = torch.cat([torch.ones_like(sep[:, :1]), sep[:, :-1]], -1)
        starts = ~sep & before
        word = (torch.cumsum(starts.long(), -1) - 1).clamp(min=0)
        offset = positions - torch.cummax(torch.where(starts, positions, torch.zeros_like(positions)), -1).values
        code = torch.where(sep, torch.zeros_like(chars), (chars + 1) * self.powers[offset] % self.MODULUS)
        hashes = torch.zeros_like(chars).scatter_add_(-1, word, code) % self.MODULUS
        count = starts.sum(-1)
        if not torch.compiler.is_compiling():  # only the words present (a handful) are embedded
            hashes = hashes[:, :max(int(count.max()), 2)]
        elif hashes.shape[-1] < 2:
            hashes = F.pad(hashes, (0, 2 - hashes.shape[-1]))
        return hashes, count

    def forward(self, text: Any) -> torch.Tensor:
        hashes, count = self.word_hashes(text)
        slots = torch.arange(hashes.shape[-1], device=hashes.device)
        count = count.reshape(-1, 1)
        keep_words = (slots < count).unsqueeze(-1).float()
        keep_pairs = (slots[:-1] < count - 1).unsqueeze(-1).float()
        pairs = (hashes[:, :-1] * 31 + hashes[:, 1:] + 1) % self.MODULUS
        embedded = self.table(torch.cat([hashes, pairs], -1) % self.buckets)
        words = (embedded[:, :hashes.shape[-1]] * keep_words).sum(-2) / count.clamp(min=1)
        pairs = (embedded[:, hashes.shape[-1]:] * keep_pairs).sum(-2) / (count - 1).clamp(min=1)
        return torch.cat([words, pairs], -1)


def string_separators(leaf: Leaf) -> list[int]:
    """The character codes that split a string leaf into words: whitespace and punctuation."""
    marks = " \t\n\r,.;:!?"
    charset = getattr(leaf.codec, "charset", None)  # Text: codes index its charset; other strings: UTF-8 bytes
    if charset is not None:
        return [i for i, ch in enumerate(charset) if ch in marks]
    return list(marks.encode())


class ImageEncoder(nn.Module):
    """Scale a (B, H, W, C) or (B, C, H, W) leaf by its bounds to [0, 1] and run a conv trunk."""

    def __init__(self, leaf: Leaf, channels_last: bool, trunk: str = "cnn", output_size: int = 256):
        super().__init__()
        self.channels_last = channels_last
        h, w, c = leaf.shape if channels_last else (leaf.shape[1], leaf.shape[2], leaf.shape[0])
        low, high = _bounds(leaf)
        low, high = float(low.min()), float(high.max())
        self.low, self.inv_range = low, 1.0 / (high - low if high > low else 1.0)
        if trunk == "nature":
            if min(h, w) < 36:
                raise EmulationError(f"NatureCNN needs images of at least 36x36 pixels, got {h}x{w}; use 'cnn' or 'impala'")
            self.trunk = nature_cnn(c)
        elif trunk == "impala":
            self.trunk = impala_cnn(c)
        elif trunk == "cnn":
            self.trunk = small_cnn(c)
        else:
            raise ValueError(f"unknown image trunk {trunk!r}; choose 'cnn', 'nature' or 'impala'")
        with torch.no_grad():
            flat = self.trunk(torch.zeros(1, c, h, w)).shape[-1]
        self.head = nn.Sequential(layer_init(nn.Linear(flat, output_size)), nn.ReLU())
        self.output_size = output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() - self.low) * self.inv_range
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.head(self.trunk(x))


class CellEncoder(nn.Module):
    """A grid whose cells hold codes, not intensities (MiniGrid's object, color and state per cell): each
    channel's value is embedded in its own table, the channel embeddings are summed per cell (BabyAI 1.1's
    bag-of-words image input, Hui et al. 2020), and rl-starter-files' conv trunk reads the result.

    Scaled as intensities by the Box's bounds (0..255 in MiniGrid), codes 0..10 all fall under 0.04: with
    the 'cnn' encoder PPO on MiniGrid-DoorKey-5x5-v0 stood at a moving mean of 0.04 after 100k frames (seed
    0), with this one it passed 0.9 at 63k (benchmarks/learning_minigrid.py)."""

    def __init__(self, leaf: Leaf, channels_last: bool, dim: int = EMBED_DIM):
        super().__init__()
        where = f"leaf {format_path(leaf.path)}"
        if leaf.dtype.kind not in "iub":
            raise EmulationError(f"{where}: 'cells' needs an integer image of codes, got {leaf.dtype}")
        self.channels_last = channels_last
        h, w = leaf.shape[:2] if channels_last else leaf.shape[1:]
        low, high = _bounds(leaf)
        axes = (0, 1) if channels_last else (1, 2)
        low, high = low.min(axis=axes), high.max(axis=axes)  # per channel
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise EmulationError(f"{where}: 'cells' needs finite bounds to size its code tables")
        nvec = (high - low + 1).astype(np.int64)
        if nvec.sum() > 16 * MAX_EMBEDDING:
            raise EmulationError(f"{where}: {int(nvec.sum())} codes in all are too many to embed; use 'cnn'")
        self.register_buffer("low", torch.as_tensor(low.astype(np.int64)))
        self.register_buffer("last", torch.as_tensor(nvec - 1))
        self.register_buffer("offsets", torch.as_tensor(np.concatenate([[0], np.cumsum(nvec)[:-1]])))
        self.table = nn.Embedding(int(nvec.sum()), dim)
        self.trunk = starter_cnn(dim)
        self.film: nn.Linear | None = None
        with torch.no_grad():
            self.output_size = self.trunk(torch.zeros(1, dim, h, w)).shape[-1]

    def condition_on(self, size: int) -> None:
        """Let ``size`` features of another leaf (a mission's words) steer the grid: FiLM (Perez et al. 2018, as
        BabyAI's models condition their conv trunk on the instruction) scales and shifts each cell's embedding,
        ``cell * (1 + gamma) + beta`` with ``(gamma, beta)`` a linear map of the features, before the conv trunk
        reads it. The trunk's first filters then depend on the mission: "fetch a red ball" can make the red
        ball's cells, and no others, light up. The map starts at zero, so the encoder starts as the unconditioned
        one."""
        self.film = nn.Linear(size, 2 * self.table.embedding_dim)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        """Weights saved before the encoder was steered (no ``film`` entries) load as a zero map: exactly the
        encoder they were trained as."""
        if self.film is not None and prefix + "table.weight" in state_dict:
            for name in ("weight", "bias"):
                state_dict.setdefault(f"{prefix}film.{name}", torch.zeros_like(getattr(self.film, name)))
        super()._load_from_state_dict(state_dict, prefix, *args)  # the hook this method overrides (torch documents it for overriding)

    def forward(self, x: torch.Tensor, condition: torch.Tensor | None = None) -> torch.Tensor:
        if not self.channels_last:
            x = x.permute(0, 2, 3, 1)
        index = torch.minimum((x.long() - self.low).clamp(min=0), self.last) + self.offsets
        cells = self.table(index).sum(-2)  # (B, H, W, dim)
        if self.film is not None and condition is not None:
            gamma, beta = self.film(condition)[:, None, None, :].chunk(2, -1)
            cells = torch.addcmul(cells + beta, cells, gamma)
        return self.trunk(cells.permute(0, 3, 1, 2))


def starter_cnn(channels: int) -> nn.Module:
    """rl-starter-files' MiniGrid trunk: 2x2 conv (16), 2x2 max-pool, 2x2 conv (32), 2x2 conv (64); a 7x7
    view becomes 64 features."""
    return nn.Sequential(
        nn.Conv2d(channels, 16, 2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 2), nn.ReLU(),
        nn.Conv2d(32, 64, 2), nn.ReLU(), nn.Flatten())


def nature_cnn(channels: int) -> nn.Module:
    """The DQN Nature paper's conv trunk (8x8/4, 4x4/2, 3x3/1), flattened."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())


def small_cnn(channels: int) -> nn.Module:
    """Two padded 3x3 convs, for grids such as MiniGrid's 7x7 view or a chess board."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Flatten())


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def impala_cnn(channels: int, depths: tuple[int, ...] = (16, 32, 32)) -> nn.Module:
    """IMPALA's residual trunk (Espeholt et al. 2018): per stage conv, 3x3/2 max-pool, two residual blocks."""
    layers: list[nn.Module] = []
    for depth in depths:
        layers += [nn.Conv2d(channels, depth, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                   _Residual(depth), _Residual(depth)]
        channels = depth
    return nn.Sequential(*layers, nn.ReLU(), nn.Flatten())


def image_channels_last(leaf: Leaf) -> bool | None:
    """True (HxWxC), False (CxHxW) or None (not an image) for a 3-d uint8 or bool Box leaf."""
    if leaf.codec.categorical or leaf.codec.encoders or len(leaf.shape) != 3 or leaf.dtype not in (np.uint8, np.bool_):
        return None
    a, b, c = leaf.shape
    if a == b or c <= 4:
        return True
    if b == c or a <= 4:
        return False
    return None


def _bounds(leaf: Leaf) -> tuple[np.ndarray, np.ndarray]:
    """A numeric leaf's bounds as float64 (``leaf.bounds``); unbounded for categorical and string leaves."""
    bounds = leaf.bounds if leaf.field is None else next(
        (f.bounds for f in leaf.codec.fields if f.name == leaf.field), None)
    if bounds is None or leaf.codec.categorical:
        return np.full(leaf.shape, -np.inf), np.full(leaf.shape, np.inf)
    return bounds.low.astype(np.float64), bounds.high.astype(np.float64)


# ---------------------------------------------------------------- choosing

CHOICES = ("flat", "embedding", "cnn", "nature", "impala", "cells", "words")


SMALL_IMAGE_CELLS = 64
"""An image of fewer cells than this (smaller than 8x8) is read by the flat encoder: at that size one linear layer
over its bytes sees every cell, where a conv trunk costs two convolutions and a wide linear layer per step (the 5x5
gridworld's 50 bytes). Larger images get a conv trunk."""


def default_choice(leaf: Leaf) -> str:
    """The built-in encoder a leaf gets without an override (``leaf``: its first field)."""
    if leaf.codec.encoders:  # the codec names its own (strings: words)
        return leaf.codec.encoders[0]
    if len(leaf.codec.fields) > 1:  # a registered leaf of several fields: each field read as numbers
        return "flat"
    if leaf.codec.categorical:
        return "embedding"
    channels_last = image_channels_last(leaf)
    if channels_last is not None:
        h, w = leaf.shape[:2] if channels_last else leaf.shape[1:]
        if h * w < SMALL_IMAGE_CELLS:
            return "flat"
        return "nature" if min(h, w) >= 36 else "cnn"
    return "flat"


def build_leaf_encoder(leaf: Leaf | list[Leaf], choice: str) -> nn.Module:
    """The built-in encoder ``choice`` for a leaf: its ``Leaf`` (a one-field leaf, or a string leaf's chars field) or
    the list of its fields' Leaf entries. 'flat' reads every field; the others read a leaf of one array."""
    fields = [leaf] if isinstance(leaf, Leaf) else list(leaf)
    leaf = fields[0]
    where = f"leaf {format_path(leaf.path)}"
    if choice not in CHOICES:
        raise ValueError(f"{where}: unknown encoder {choice!r}; choose one of {CHOICES}, 'drop', or pass an nn.Module")
    own = leaf.codec.encoders
    if choice == "flat" and not own:
        return Flat(fields)
    if len(fields) > 1 and not own:
        names = ", ".join(str(f.field) for f in fields)
        raise EmulationError(f"{where} has {len(fields)} fields ({names}): {choice!r} reads a leaf of one array; use "
                             "'flat' (every field), 'drop', or pass an nn.Module (it gets a tuple of the fields)")
    if own:  # a leaf whose codec names the encoders it takes (strings: their characters, read as text)
        if choice not in own:
            raise EmulationError(f"{where}: its leaves take the {' or '.join(map(repr, own))} encoder, not {choice!r}")
        if choice == "words":
            return WordEncoder(string_separators(leaf), leaf.codec.vocab, int(leaf.shape[-1]))
        return TextEncoder(leaf.codec.vocab)
    if choice in ("cnn", "nature", "impala", "cells"):
        channels_last = image_channels_last(leaf)
        if channels_last is None:
            if len(leaf.shape) != 3:
                raise EmulationError(f"{where}: {choice!r} needs a 3-d image leaf, got shape {leaf.shape}")
            channels_last = leaf.shape[-1] <= leaf.shape[0]
        if choice == "cells":
            return CellEncoder(leaf, channels_last)
        return ImageEncoder(leaf, channels_last, trunk=choice)
    if choice == "embedding":
        bounds = leaf.bounds
        if leaf.codec.categorical and leaf.shape == ():  # one choice of n, counted from start
            n, start = int(bounds.high) - int(bounds.low) + 1, int(bounds.low)
            return DiscreteEmbedding(np.array([n]), np.array([start])) if n <= MAX_EMBEDDING else ScaledIndex(n, start)
        if leaf.codec.categorical:
            return _embedding_or_refuse(bounds.high.astype(object) - bounds.low.astype(object) + 1, bounds.low, where)
        if bounds is not None and bounds.integer:
            low, high = _bounds(leaf)
            return _embedding_or_refuse(high - low + 1, low, where)
        raise EmulationError(f"{where}: 'embedding' needs a categorical (Discrete, MultiDiscrete) or integer leaf, "
                             f"got {leaf.kind} {leaf.dtype}")
    return Flat(leaf)


def _embedding_or_refuse(nvec: np.ndarray, start: np.ndarray, where: str) -> nn.Module:
    if np.any(~np.isfinite(nvec.astype(np.float64))) or nvec.sum() > 16 * MAX_EMBEDDING:
        raise EmulationError(f"{where}: {int(nvec.sum())} choices in all are too many to embed; use 'flat'")
    return DiscreteEmbedding(nvec.astype(np.int64), start.astype(np.int64))


# ---------------------------------------------------------------- LayoutEncoder

def leaf_tensors(x: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """One tensor per ``layout.leaves`` entry from rows ``x (B, nbytes)`` (``nativize``'s views, before
    they are put into the structure); bool leaves come as their raw uint8 bytes (see the module
    note on Inductor)."""
    return [x[..., start:end].reshape(x.shape[:-1] + shape) if leaf.dtype == np.bool_ else view
            for leaf, view, (start, end, _, shape) in zip(layout.leaves, leaf_views(x, layout), layout.spans)]


class LayoutEncoder(nn.Module):
    """Rows ``(..., nbytes)`` uint8 -> features ``(..., hidden)``: each leaf path embedded by its sub-encoder, the
    embeddings side by side, one ``Linear + ReLU`` projection (``activation_name="tanh"``: ``Linear + tanh``).

    The leaves read by the flat encoder (numbers, small images, every field of a registered leaf) are read
    together: per dtype present, one slice of the row, one dtype view and one float cast, then one affine scaling
    of all of them. A step costs a handful of ops however many such leaves the layout has (each op is a kernel
    launch on a GPU). The other sub-encoders get their leaf's typed view ``(B, *shape)`` (2-d ``(B, n)`` for
    embeddings), or for a leaf of several fields its codec's view of them (``(chars, length)`` for strings, a tuple
    by default).

    With ``condition`` (the default), the built-in text encoders' features are also given to the sub-encoders that
    take a condition (``condition_on``: the 'cells' grid encoder, FiLM on its cell embeddings), after those text
    encoders have run.

    A layout whose root is a single Box also takes that Box's own arrays (``(..., *shape)`` in its
    dtype), as emulated envs pass plain Box observations through unpacked."""

    def __init__(self, layout: Layout, hidden: int = 128, overrides: dict | None = None, normalize: bool = False,
                 activation_name: str = "relu", condition: bool = True):
        super().__init__()
        self.layout, self.hidden = layout, hidden
        self._act, act_module = activation(activation_name)
        self.activation = activation_name
        self.normalize = normalize
        self.output_size = hidden
        overrides = {(k if isinstance(k, tuple) else (k,)): v for k, v in (overrides or {}).items()}
        paths: dict[tuple, list[int]] = {}
        for i, leaf in enumerate(layout.leaves):
            paths.setdefault(leaf.path, []).append(i)
        unknown = [p for p in overrides if p not in paths]
        if unknown:
            raise EmulationError(f"overrides name no leaf: {[format_path(p) for p in unknown]}; "
                                 f"leaves are {[format_path(p) for p in paths]}")
        flat_fields: list[Leaf] = []
        encoders: list[nn.Module] = []
        self.inputs: list[tuple] = []  # how each sub-encoder's input is read from a row (see _read)
        self.paths: list[tuple] = []  # the leaf path of each sub-encoder
        for path, ids in paths.items():
            fields = [layout.leaves[i] for i in ids]
            choice = overrides.get(path, default_choice(fields[0]))
            if choice is None or choice == "drop":
                continue
            module = choice if isinstance(choice, nn.Module) else build_leaf_encoder(fields, choice)
            if not hasattr(module, "output_size"):
                raise EmulationError(f"override for leaf {format_path(path)}: the module needs an output_size attribute")
            if type(module) is Flat and not isinstance(choice, nn.Module):
                flat_fields += fields
                continue
            encoders.append(module)
            self.paths.append(path)
            self.inputs.append(_input_plan(fields, two_d=isinstance(module, (DiscreteEmbedding, ScaledIndex))))
        if not encoders and not flat_fields:
            raise EmulationError("every leaf was dropped: the encoder has no input")
        self.leaf_encoders = nn.ModuleList(encoders)
        self._plan_conditioning(condition)
        self._plan_flat(flat_fields)
        self.concat_size = self.flat_size + sum(m.output_size for m in encoders)
        self.project = nn.Sequential(layer_init(nn.Linear(self.concat_size, hidden)), act_module())
        self._linear = (self.project[0],)  # a plain tuple: Sequential indexing costs a microsecond a call
        self._passthrough: dict = {}  # (dtype, shape) -> whether such input is the Box itself
        self.passthrough_leaf = layout.box
        self.passthrough_dtype = torch_dtype(layout.box.dtype) if layout.box is not None else None

    def _plan_conditioning(self, condition: bool) -> None:
        """With ``condition``, the built-in text encoders' features (a mission) steer the encoders that can take them
        (``condition_on``: the 'cells' grids), so the policy sees the grid as the text asks. ``self.sources``: the
        indices of the text encoders, ``self.steered``: of the steered ones."""
        self.sources: tuple[int, ...] = ()
        self.steered: tuple[int, ...] = ()
        if not condition:
            return
        sources = tuple(i for i, m in enumerate(self.leaf_encoders) if type(m) in (WordEncoder, TextEncoder))
        steered = tuple(i for i, m in enumerate(self.leaf_encoders) if hasattr(m, "condition_on"))
        if not sources or not steered:
            return
        size = sum(self.leaf_encoders[i].output_size for i in sources)
        for i in steered:
            self.leaf_encoders[i].condition_on(size)
        self.sources, self.steered = sources, steered

    def _leaf_features(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Each sub-encoder's features of rows ``(B, nbytes)``, in order; the steered ones after their sources."""
        if not self.steered:
            return [module(_read(rows, plan)) for module, plan in zip(self.leaf_encoders, self.inputs)]
        out: list = [None] * len(self.leaf_encoders)
        for i, (module, plan) in enumerate(zip(self.leaf_encoders, self.inputs)):
            if i not in self.steered:
                out[i] = module(_read(rows, plan))
        condition = torch.cat([out[i] for i in self.sources], -1) if len(self.sources) > 1 else out[self.sources[0]]
        for i in self.steered:
            out[i] = self.leaf_encoders[i](_read(rows, self.inputs[i]), condition)
        return out

    def _plan_flat(self, fields: list[Leaf]) -> None:
        """Group the flat fields by dtype: per group a byte range of the row and, when other bytes lie between
        its fields, the element columns to keep. The scaling constants follow the same column order."""
        self.flat_size = sum(math.prod(f.shape) for f in fields)
        self.flat_groups: list[tuple[int, int, torch.dtype, str | None]] = []
        self.flat_leaves: tuple[Leaf, ...] = ()  # the flat fields in the order of their feature columns
        by_dtype: dict[str, list[Leaf]] = {}
        for f in sorted(fields, key=lambda f: f.offset):
            if f.nbytes:
                by_dtype.setdefault("uint8" if f.dtype == np.bool_ else f.dtype.name, []).append(f)  # bool: its bytes
        constants = []
        for name, group in by_dtype.items():
            itemsize = np.dtype(name).itemsize
            lo, hi = group[0].offset, max(f.offset + f.nbytes for f in group)
            cols = np.concatenate([(f.offset - lo) // itemsize + np.arange(math.prod(f.shape)) for f in group])
            index = None
            if len(cols) != (hi - lo) // itemsize:  # other leaves' bytes in between: keep this group's columns
                index = f"flat_columns_{len(self.flat_groups)}"
                self.register_buffer(index, torch.as_tensor(cols, dtype=torch.long), persistent=False)
            self.flat_groups.append((lo, hi, TORCH_DTYPES[name], index))
            constants += [_flat_constants(f) for f in group]
            self.flat_leaves += tuple(group)
        scale, shift, symlog = (np.concatenate(c) if c else np.zeros(0) for c in zip(*constants)) if constants \
            else (np.zeros(0),) * 3
        self.register_buffer("flat_scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("flat_shift", torch.as_tensor(shift, dtype=torch.float32))
        if self.normalize:
            # Running observation statistics of the bound-scaled flat features (CleanRL's NormalizeObservation,
            # SB3's VecNormalize): flat_scale and flat_shift then hold the bounds' scaling composed with the
            # normalization, recomputed by update_normalization, so a step costs one clamp more. Saved with the
            # weights: eval reads observations as the run did.
            self.register_buffer("bounds_scale", self.flat_scale.clone())
            self.register_buffer("bounds_shift", self.flat_shift.clone())
            self.register_buffer("obs_mean", torch.zeros(len(scale), dtype=torch.float64))
            self.register_buffer("obs_var", torch.ones(len(scale), dtype=torch.float64))
            self.register_buffer("obs_count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("flat_symlog", torch.as_tensor(np.asarray(symlog, bool)))
        self.flat_any_symlog = bool(np.asarray(symlog, bool).any())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box = self.passthrough_leaf
        if box is not None and self._is_passthrough(x):
            batch = tuple(x.shape[: x.ndim - len(box.shape)])
            if self.flat_size:  # the Box is the one flat leaf
                parts = [self._scale(self._raw(x.reshape(-1, self.flat_size)))]
            else:
                parts = [self.leaf_encoders[0](x.reshape((-1,) + box.shape))]
        else:
            check_rows(x, self.layout)
            batch = tuple(x.shape[:-1])
            rows = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
            parts = [self._flat(rows)] if self.flat_size else []
            parts += self._leaf_features(rows)
        features = parts[0] if len(parts) == 1 else torch.cat(parts, -1)
        linear = self._linear[0]
        out = self._act(F.linear(features, linear.weight, linear.bias))  # self.project, without module calls
        return out if len(batch) == 1 else out.reshape(batch + (self.hidden,))

    def reads_flat_box(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is the layout's float32 Box itself, one row per leading index, read by the flat features
        alone (the case ``packrl.models.fast_forms`` computes without ``forward``)."""
        box = self.passthrough_leaf
        return (box is not None and self.flat_size > 0 and not self.flat_any_symlog and x.dtype == torch.float32
                and x.ndim == len(box.shape) + 1 and self._is_passthrough(x))

    def _flat(self, rows: torch.Tensor) -> torch.Tensor:
        """Every flat field of rows ``(B, nbytes)`` as scaled floats ``(B, flat_size)``."""
        return self._scale(self._flat_raw(rows))

    def _flat_raw(self, rows: torch.Tensor) -> torch.Tensor:
        """Every flat field of rows ``(B, nbytes)`` as floats before the scaling (``_raw``)."""
        parts = []
        for lo, hi, dtype, index in self.flat_groups:
            part = rows[:, lo:hi]
            if dtype != torch.uint8:
                part = part.view(dtype)
            if index is not None:
                part = part.index_select(1, getattr(self, index))
            parts.append(part)
        if len(parts) > 1:
            if not all(p.dtype in _PROMOTE_TO_INT64 for p in parts):
                parts = [p if p.dtype == torch.float32 else p.float() for p in parts]
            return self._raw(torch.cat(parts, -1))  # integer parts: one cat promotes them to int64, one cast
        return self._raw(parts[0])

    def _raw(self, x: torch.Tensor) -> torch.Tensor:
        """Flat values as float32, symlog applied where the bounds are too wide to scale."""
        if x.dtype != torch.float32:
            x = x.float()
        if self.flat_any_symlog:
            x = torch.where(self.flat_symlog, torch.sign(x) * torch.log1p(x.abs()), x)
        return x

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        """``_raw`` values scaled by the bounds (and normalized, clipped, with ``normalize``)."""
        x = torch.addcmul(self.flat_shift, x, self.flat_scale)
        return x.clamp(-NORMALIZED_CLIP, NORMALIZED_CLIP) if self.normalize else x

    @torch.no_grad()
    def update_normalization(self, x: torch.Tensor) -> None:
        """Merge the flat features of observations ``x`` (rows ``(M, nbytes)``, or the Box's own rows) into the
        running mean and variance (Chan et al.'s parallel update, as gymnasium's RunningMeanStd) and recompute the
        composed scaling. No-op unless built with ``normalize=True`` or without flat leaves."""
        if not self.normalize or not self.flat_size or x.shape[0] == 0:
            return
        if self.passthrough_leaf is not None and self._is_passthrough(x):
            raw = self._raw(x.reshape(-1, self.flat_size))
        else:
            check_rows(x, self.layout)
            raw = self._flat_raw(x.reshape(-1, x.shape[-1]))
        features = torch.addcmul(self.bounds_shift.double(), raw.double(), self.bounds_scale.double())  # bound-scaled
        mean, var, count = merge_moments(self.obs_mean, self.obs_var, self.obs_count, features.mean(0),
                                         features.var(0, unbiased=False), float(features.shape[0]))
        self.obs_mean.copy_(mean)
        self.obs_var.copy_(var)
        self.obs_count.copy_(count)
        self.refresh_normalization()

    @torch.no_grad()
    def refresh_normalization(self) -> None:
        """The composed scaling from the bounds' scaling and the running statistics."""
        inv_std = (self.obs_var + NORMALIZE_EPS).rsqrt()
        self.flat_scale.copy_((self.bounds_scale * inv_std).float())
        self.flat_shift.copy_(((self.bounds_shift - self.obs_mean) * inv_std).float())

    def _is_passthrough(self, x: torch.Tensor) -> bool:
        if torch.compiler.is_compiling():  # traced once per shape anyway; no dict for Dynamo to guard on
            return _is_passthrough(x, self.passthrough_leaf, self.passthrough_dtype)
        key = (x.dtype, x.shape)
        known = self._passthrough.get(key)
        if known is None:
            known = self._passthrough[key] = _is_passthrough(x, self.passthrough_leaf, self.passthrough_dtype)
        return known


_PROMOTE_TO_INT64 = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)  # exact in int64


def _input_plan(fields: list[Leaf], two_d: bool) -> tuple:
    """How a sub-encoder's input is read from a row: ``(codec, [(start, end, dtype, shape), ...])``. One field is
    its view; several are the codec's view of them (a string codec's ``(chars, length)``, a tuple by default)."""
    spans = [(f.offset, f.offset + f.nbytes, TORCH_DTYPES["uint8" if f.dtype == np.bool_ else f.dtype.name],
              (math.prod(f.shape),) if two_d else f.shape) for f in fields]
    return (fields[0].codec if len(fields) > 1 else None), spans


def _read(rows: torch.Tensor, plan: tuple) -> Any:
    codec, spans = plan
    batch = tuple(rows.shape[:1])
    views = [leaf_view(rows, batch, *span) for span in spans]  # bool leaves: their bytes (the span's uint8)
    return codec.view(tuple(views)) if codec is not None else views[0]


def _is_passthrough(x: torch.Tensor, leaf: Leaf, dtype: torch.dtype) -> bool:
    """Plain Box observation (its own dtype and shape) rather than packed uint8 rows."""
    return x.dtype == dtype and tuple(x.shape[x.ndim - len(leaf.shape):]) == leaf.shape \
        and not (x.dtype == torch.uint8 and len(leaf.shape) == 1)


class NativeEncoder(nn.Module):
    """A plain module over the nativized structure: ``module(nativize(rows, layout)) -> (B, output_size)``."""

    def __init__(self, layout: Layout, module: nn.Module, output_size: int):
        super().__init__()
        self.layout, self.module, self.output_size = layout, module, output_size

    def forward(self, x: torch.Tensor) -> Any:
        return self.module(nativize(x, self.layout))
