"""Action distributions over one flat logits tensor: masked categoricals, squashed Gaussians, hybrids.

Every head emits a single ``logits`` tensor of shape ``(..., logits_size)`` (easy to store in a
rollout buffer and to compile); ``ActionSpec.distribution(logits)`` turns it back into a
distribution with ``sample()``, ``log_prob(action)``, ``entropy()`` and ``mode()``. Actions come
in the env's policy-facing form: int64 ``(...)`` for Discrete, int64 ``(..., k)`` for
MultiDiscrete, float ``(..., m)`` for Box, ``{"discrete", "continuous"}`` for hybrid.

Masked choices carry the logit ``MASKED`` (the dtype's most negative finite value, as torch's own
Categorical uses for its clamp): their probability is exactly 0, they are never sampled and they
add exactly 0 to the entropy. A branch whose every choice is masked stays uniform instead of NaN
(rows of agents that are not acting often carry an all-zero mask).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from packrl.emulation.actions import ActionLayout
from packrl.errors import EmulationError

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""Range the Gaussian log standard deviation is clamped to (keeps log-probs finite)."""

FINITE_LIMIT = 1e18
"""Box bounds of larger magnitude count as infinite for the squashing map (the env still gets its own bounds)."""


def apply_mask(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Set the logits of masked choices (``mask`` false/0) to the dtype's most negative finite value."""
    if mask is None:
        return logits
    return logits.masked_fill(mask == 0, torch.finfo(logits.dtype).min)


# ---------------------------------------------------------------- categorical branches

class MultiCategorical:
    """Independent categoricals over branches ``nvec`` read from ``logits (..., sum(nvec))``.

    Branches of unequal width are padded to the widest with ``-inf`` (probability exactly 0);
    ``scalar=True`` (a plain Discrete space) gives actions of shape ``(...)`` instead of ``(..., 1)``."""

    def __init__(self, logits: torch.Tensor, nvec: tuple[int, ...], scalar: bool = False):
        self.nvec, self.scalar = nvec, scalar
        self.batch = tuple(logits.shape[:-1])
        width = max(nvec)
        if len(nvec) == 1 or all(n == width for n in nvec):
            padded = logits.reshape(self.batch + (len(nvec), width))
        else:  # one pad slot at the end, gathered into each narrower branch's tail
            index = _pad_index_tensor(nvec, logits.device)
            padded = F.pad(logits, (0, 1), value=-math.inf).index_select(-1, index).view(self.batch + (len(nvec), width))
        self.logits = padded if padded.dtype == torch.float32 else padded.float()
        self.log_probs = torch.log_softmax(self.logits, -1)  # (..., k, width)

    @property
    def probs(self) -> torch.Tensor:
        return self.log_probs.exp()

    def sample(self) -> torch.Tensor:
        # The exponential race (Gumbel-max): argmax(log p - log E), E ~ Exp(1) i.i.d., picks choice i with
        # probability p_i exactly, in three small ops where multinomial costs several times as much on the
        # small batches of a rollout. E is kept >= the smallest normal float so -log E stays finite
        # (<= 87.4): a choice of probability 0 (log p = -inf for padding, about -3.4e38 for masked logits)
        # can never win over one of positive probability.
        return self.sample_with_log_prob()[0]

    def sample_with_log_prob(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, log_prob(action))`` of one draw, sharing the gather index (the rollout's form). ``noise``:
        Gumbel draws shaped like ``log_probs`` (``ActionSpec.fill_noise``) instead of drawing here."""
        if noise is None:
            noise = gumbel_(torch.empty_like(self.log_probs))
        choice = (self.log_probs + noise).argmax(-1, keepdim=True)  # (..., k, 1)
        log_prob = self.log_probs.gather(-1, choice)
        if self.scalar:
            return choice.reshape(self.batch), log_prob.reshape(self.batch)
        return choice.squeeze(-1), log_prob.squeeze(-1).sum(-1)

    def sample_into(self, noise: torch.Tensor, action: torch.Tensor, log_prob: torch.Tensor) -> None:
        """The rollout's draw written into storage, five ops and nothing allocated from the host (CUDA-graph safe):
        ``action`` ``(..., k)`` int64 (a scalar action's ``(..., 1)`` view), ``log_prob`` ``(...)``."""
        torch.argmax(self.log_probs + noise, -1, out=action)
        torch.sum(self.log_probs.gather(-1, action.unsqueeze(-1)), (-2, -1), out=log_prob)

    def mode(self) -> torch.Tensor:
        choice = self.log_probs.argmax(-1)
        return choice[..., 0] if self.scalar else choice

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        action = action.long()
        if self.scalar:
            return self.log_probs.gather(-1, action.reshape(self.batch + (1, 1))).reshape(self.batch)
        return self.log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1).sum(-1)

    def entropy(self) -> torch.Tensor:
        # clamp -inf (padding) to a finite value so that 0 * log 0 is 0, not NaN
        log_probs = self.log_probs.clamp(min=torch.finfo(self.log_probs.dtype).min)
        return -(log_probs.exp() * log_probs).sum((-1, -2))


def gumbel_(x: torch.Tensor) -> torch.Tensor:
    """Fill ``x`` with Gumbel draws ``-log E``, E ~ Exp(1), in place. argmax(log p + g) picks choice i with
    probability p_i exactly (the exponential race), in fewer and smaller ops than multinomial. E is kept >= the
    smallest normal float so g stays finite (<= 87.4): a choice of probability 0 (log p = -inf for padding, about
    -3.4e38 for masked logits) can never win over one of positive probability."""
    return x.exponential_().clamp_(min=torch.finfo(x.dtype).tiny).log_().neg_()


_PAD_INDEX: dict[tuple, torch.Tensor] = {}


def _pad_index_tensor(nvec: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``_pad_index`` as a tensor on ``device``, made once per (nvec, device): no host-to-device copy per call, so a
    rollout step that builds a MultiCategorical can be captured in a CUDA graph."""
    if torch.compiler.is_compiling():
        return torch.as_tensor(_pad_index(nvec), device=device)
    key = (nvec, device)
    index = _PAD_INDEX.get(key)
    if index is None:
        with torch.inference_mode(False):  # made in a rollout, used by training's backward too: a normal tensor
            index = _PAD_INDEX[key] = torch.as_tensor(_pad_index(nvec), device=device)
    return index


def _pad_index(nvec: tuple[int, ...]) -> list[int]:
    """Gather index from ``cat([logits, pad])`` to ``(k, max(nvec))``; ``sum(nvec)`` is the pad slot."""
    width, total, index, first = max(nvec), sum(nvec), [], 0
    for n in nvec:
        index += list(range(first, first + n)) + [total] * (width - n)
        first += n
    return index


# ---------------------------------------------------------------- bounded Gaussians

class SquashedNormal:
    """A diagonal Gaussian on a latent ``u``, mapped into each dimension's own bounds.

    Per dimension: both bounds finite -> ``mid + half * tanh(u)``; only ``low`` finite ->
    ``low + softplus(u)``; only ``high`` finite -> ``high - softplus(-u)``; neither -> ``u``.
    ``log_prob(a)`` is the density of the action ``a`` itself: the latent density at
    ``u = f^-1(a)`` minus ``log |f'(u)|``. ``entropy()`` is the latent Gaussian's entropy (the
    squashed entropy has no closed form; this is the usual PPO regularizer for squashed policies,
    and exact for unbounded dimensions)."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor, bounds: "Bounds"):
        self.mean = mean.float()
        self.log_std = log_std.float().clamp(LOG_STD_MIN, LOG_STD_MAX)
        self.std = self.log_std.exp()
        self.bounds = bounds.to(mean.device)

    def sample(self, noise: torch.Tensor | None = None) -> torch.Tensor:
        """A draw; ``noise``: standard normal draws shaped like ``mean`` instead of drawing here."""
        u = torch.addcmul(self.mean, self.std, torch.randn_like(self.mean) if noise is None else noise)
        return self.bounds.squash(u)

    def sample_with_log_prob(self, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        action = self.sample(noise)
        return action, self.log_prob(action)

    def mode(self) -> torch.Tensor:
        return self.bounds.squash(self.mean)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        u = self.bounds.unsquash(action.float())
        z = (u - self.mean) / self.std
        latent = -0.5 * z * z - self.log_std - 0.5 * math.log(2 * math.pi)
        return (latent - self.bounds.log_det(u)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum(-1)


class Bounds:
    """Per-dimension bound kinds and the constants of each map. Every branch is computed on safe
    constants (no inf or NaN anywhere) so that ``torch.where`` never routes a NaN into a gradient."""

    def __init__(self, low: np.ndarray, high: np.ndarray):
        low, high = np.asarray(low, np.float64).reshape(-1), np.asarray(high, np.float64).reshape(-1)
        # bounds beyond FINITE_LIMIT (e.g. +-float32 max) are treated as infinite: a tanh over them is meaningless
        lo, hi = np.abs(low) < FINITE_LIMIT, np.abs(high) < FINITE_LIMIT
        self._copies: dict = {}
        self.low_np, self.high_np = low, high
        both = lo & hi
        safe_low, safe_high = np.where(lo, low, 0.0), np.where(hi, high, 0.0)
        t = lambda a, dtype=torch.float32: torch.as_tensor(a, dtype=dtype)  # noqa: E731
        self.both, self.lower, self.upper = t(both, torch.bool), t(lo & ~hi, torch.bool), t(hi & ~lo, torch.bool)
        self.mid = t(np.where(both, (safe_low + safe_high) / 2, 0.0))
        half = (safe_high - safe_low) / 2
        self.half = t(np.where(both & (half > 0), half, 1.0))  # low == high: the clamp pins the value
        self.low, self.high = t(safe_low), t(safe_high)
        # clamp targets, so rounding never puts an action outside [low, high]
        self.clamp_low = t(np.where(lo, low, -np.inf))
        self.clamp_high = t(np.where(hi, high, np.inf))

    def to(self, device: torch.device) -> "Bounds":
        """These bounds with their tensors on ``device`` (one copy per device, cached)."""
        device = torch.device(device)
        if self.mid.device == device:
            return self
        if device not in self._copies:
            out = object.__new__(Bounds)
            moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
            out.__dict__.update(moved, _copies={})  # the copy caches copies of its own
            self._copies[device] = out
        return self._copies[device]

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        a = torch.where(self.both, self.mid + self.half * torch.tanh(u),
                        torch.where(self.lower, self.low + F.softplus(u),
                                    torch.where(self.upper, self.high - F.softplus(-u), u)))
        return torch.maximum(torch.minimum(a, self.clamp_high), self.clamp_low)

    def unsquash(self, a: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(a.dtype).eps
        y = ((a - self.mid) / self.half).clamp(-1 + eps, 1 - eps)
        above = (a - self.low).clamp(min=1e-20)
        below = (self.high - a).clamp(min=1e-20)
        return torch.where(self.both, torch.atanh(y),
                           torch.where(self.lower, _softplus_inverse(above),
                                       torch.where(self.upper, -_softplus_inverse(below), a)))

    def log_det(self, u: torch.Tensor) -> torch.Tensor:
        """``log |d squash / du|`` per dimension."""
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|
        tanh = torch.log(self.half) + 2 * (math.log(2) - u - F.softplus(-2 * u))
        return torch.where(self.both, tanh,
                           torch.where(self.lower, -F.softplus(-u),
                                       torch.where(self.upper, -F.softplus(u), torch.zeros_like(u))))


def _softplus_inverse(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


# ---------------------------------------------------------------- hybrid

class Hybrid:
    """A discrete part and a continuous part sampled independently; log-prob and entropy are sums."""

    def __init__(self, discrete: MultiCategorical, continuous: SquashedNormal):
        self.discrete, self.continuous = discrete, continuous

    def sample(self) -> dict[str, torch.Tensor]:
        return {"discrete": self.discrete.sample(), "continuous": self.continuous.sample()}

    def sample_with_log_prob(self, noise: tuple | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        discrete, log_prob = self.discrete.sample_with_log_prob(None if noise is None else noise[0])
        continuous, continuous_log_prob = self.continuous.sample_with_log_prob(None if noise is None else noise[1])
        return {"discrete": discrete, "continuous": continuous}, log_prob + continuous_log_prob

    def mode(self) -> dict[str, torch.Tensor]:
        return {"discrete": self.discrete.mode(), "continuous": self.continuous.mode()}

    def log_prob(self, action: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.discrete.log_prob(action["discrete"]) + self.continuous.log_prob(action["continuous"])

    def entropy(self) -> torch.Tensor:
        return self.discrete.entropy() + self.continuous.entropy()


# ---------------------------------------------------------------- spec

class ActionSpec:
    """How a flat logits tensor maps to a distribution for one ActionLayout.

    Logits layout (last axis): ``[discrete logits (sum(nvec)) | mean (m) | log_std (m)]``.
    ``mask_size`` is the width an action mask must have (``sum(nvec)``, the discrete choices).

    ``squash=False`` leaves Box actions an unbounded Gaussian, clipped to the space's bounds only on the way to the
    env (``to_numpy``): CleanRL's ``ppo_continuous_action`` (its ClipAction wrapper), whose log-probabilities are the
    Gaussian's of the unclipped draw. The default maps each draw into the bounds (``SquashedNormal``)."""

    def __init__(self, action: ActionLayout, squash: bool = True):
        self.action = action
        self.squash = squash
        self.kind = action.kind
        self.nvec = tuple(int(n) for n in action.nvec)
        self.num_discrete = sum(self.nvec)
        self.num_continuous = action.num_continuous
        self.logits_size = self.num_discrete + 2 * self.num_continuous
        self.mask_size = self.num_discrete
        low, high = (action.low, action.high) if squash else (np.full_like(action.low, -np.inf, np.float64),
                                                                np.full_like(action.high, np.inf, np.float64))
        self.bounds = Bounds(low, high) if self.num_continuous else None
        space = action.policy_space
        self.continuous_space = space["continuous"] if self.kind == "hybrid" else space if self.kind == "continuous" else None

    def distribution(self, logits: torch.Tensor) -> Any:
        """The distribution of ``logits (..., logits_size)``."""
        if logits.shape[-1] != self.logits_size:
            raise EmulationError(f"{self.kind} action head needs logits of width {self.logits_size}, got shape {tuple(logits.shape)}")
        d, m = self.num_discrete, self.num_continuous
        disc = MultiCategorical(logits if not m else logits[..., :d], self.nvec, scalar=self.kind == "discrete") if d else None
        cont = SquashedNormal(logits[..., d:d + m], logits[..., d + m:], self.bounds) if m else None
        if disc is not None and cont is not None:
            return Hybrid(disc, cont)
        return disc if disc is not None else cont

    def step_sampler(self, rows: int, device: torch.device) -> Callable[..., None] | None:
        """``distribution(logits).sample_into(noise, action, log_prob)`` for float32 logits ``(rows, logits_size)``
        on ``device``, as one function of the same ops writing into buffers of its own (the rollout's form: no
        distribution object or allocation per step; run without autograd). For discrete choices of one width (a
        Discrete, a MultiDiscrete of equal branches); None otherwise."""
        if self.kind not in ("discrete", "multidiscrete") or len(set(self.nvec)) != 1:
            return None
        shape = (rows, len(self.nvec), self.nvec[0])
        log_probs, scores = torch.empty(shape, device=device), torch.empty(shape, device=device)
        picked = torch.empty(shape[:2] + (1,), device=device)

        def sample_into(logits: torch.Tensor, noise: torch.Tensor, action: torch.Tensor, log_prob: torch.Tensor) -> None:
            torch.log_softmax(logits.reshape(shape), -1, out=log_probs)
            torch.argmax(torch.add(log_probs, noise, out=scores), -1, out=action)
            torch.sum(torch.gather(log_probs, -1, action.unsqueeze(-1), out=picked), (-2, -1), out=log_prob)

        def sample_one_branch_into(logits: torch.Tensor, noise: torch.Tensor, action: torch.Tensor,
                                   log_prob: torch.Tensor) -> None:  # the sum over one branch is its one term
            torch.log_softmax(logits.reshape(shape), -1, out=log_probs)
            torch.argmax(torch.add(log_probs, noise, out=scores), -1, out=action)
            torch.gather(log_probs, -1, action.unsqueeze(-1), out=log_prob.view(shape[:2] + (1,)))
        return sample_one_branch_into if len(self.nvec) == 1 else sample_into

    # ------------------------------------------------------------ rollout storage

    def empty_actions(self, batch: tuple, device: torch.device) -> Any:
        """Zeroed storage for actions of ``batch`` rows in the policy-facing form ``sample()`` gives."""
        k, m = len(self.nvec), self.num_continuous
        choices = lambda: torch.zeros(batch if self.kind == "discrete" else (*batch, k), dtype=torch.long,  # noqa: E731
                                      device=device)
        values = lambda: torch.zeros((*batch, m), device=device)  # noqa: E731
        if self.kind == "hybrid":
            return {"discrete": choices(), "continuous": values()}
        return values() if self.kind == "continuous" else choices()

    def empty_noise(self, batch: tuple, device: torch.device) -> Any:
        """Storage for the draws of ``batch`` rows' samples (``fill_noise``): Gumbel draws ``(*batch, k, width)`` for
        the discrete branches, standard normal ``(*batch, m)`` for the continuous dimensions, a pair for hybrid."""
        gumbel = lambda: torch.zeros((*batch, len(self.nvec), max(self.nvec)), device=device)  # noqa: E731
        normal = lambda: torch.zeros((*batch, self.num_continuous), device=device)  # noqa: E731
        if self.kind == "hybrid":
            return gumbel(), normal()
        return normal() if self.kind == "continuous" else gumbel()

    def fill_noise(self, noise: Any) -> None:
        """Draw ``empty_noise``'s storage anew, in place (a rollout draws all of its steps' noise at once)."""
        if self.kind == "hybrid":
            gumbel_(noise[0])
            noise[1].normal_()
        elif self.kind == "continuous":
            noise.normal_()
        else:
            gumbel_(noise)

    def to_numpy(self, action: Any) -> Any:
        """An action from ``sample()``/``mode()`` as numpy arrays ready for ``env.step``: int64 choices,
        continuous values in the policy space's dtype and inside its bounds (rounding clipped)."""
        if self.kind == "hybrid":
            return {"discrete": action["discrete"].detach().cpu().numpy().astype(np.int64),
                    "continuous": self._continuous_numpy(action["continuous"])}
        if self.kind == "continuous":
            return self._continuous_numpy(action)
        return action.detach().cpu().numpy().astype(np.int64)

    def _continuous_numpy(self, action: torch.Tensor) -> np.ndarray:
        space = self.continuous_space
        value = action.detach().cpu().numpy().astype(space.dtype)  # (..., m)
        return np.clip(value, np.asarray(space.low).reshape(-1), np.asarray(space.high).reshape(-1)).astype(space.dtype)
