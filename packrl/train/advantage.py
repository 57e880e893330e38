"""Advantages that tell termination from truncation: a float64 reference, a Numba CPU kernel and a
Triton CUDA kernel, all computing the same recursion.

Inputs are ``(T, N)`` arrays (time, rows): ``values`` V(obs_t), ``rewards`` r_t, ``terminals`` and
``truncations`` (the episode ended at step t), ``final_values`` V(final observation) for rows that
truncated at t (read only there), ``masks`` (the row acted at t), and ``next_value`` (N,) V(obs_T).

For an acting step t, with c the chain carried from later steps::

    terminal:    delta = r_t - V_t                    cut
    truncation:  delta = r_t + gamma * V(final_t) - V_t  cut
    otherwise:   delta = r_t + R + gamma * V_next - V_t  continue
    A_t = rho_t * delta + gamma * lambda * c_t * A_next   (A_next = 0 after a cut)

``V_next`` is the value of the row's next acting step (``next_value`` after the last step), never
the first observation of the next episode. Masked steps (dead or absent agents, AEC agents waiting
for their turn) get A = 0 and are transparent: their rewards R are added to the row's previous
decision and an end on a masked step cuts the chain there. ``rho_t = min(ratio, rho_clip)`` and
``c_t = min(ratio, c_clip)`` (V-trace) when ``ratios`` is given, else 1 (plain GAE). Value targets
are ``advantages + values``.
"""
from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

__all__ = ["advantages_cuda", "advantages_numba", "compute_advantages", "cut_pending_decisions", "reference_advantages"]


def reference_advantages(values: Any, rewards: Any, terminals: Any, truncations: Any, final_values: Any,
                         next_value: Any, masks: Any = None, gamma: float = 0.99, gae_lambda: float = 0.95,
                         ratios: Any = None, rho_clip: float = 1.0, c_clip: float = 1.0) -> np.ndarray:
    """The recursion above written plainly in float64 Python: the ground truth the kernels are tested against."""
    v, r, fv = (np.asarray(a, np.float64) for a in (values, rewards, final_values))
    term, trunc = np.asarray(terminals, bool), np.asarray(truncations, bool)
    T, N = v.shape
    mask = np.ones((T, N), bool) if masks is None else np.asarray(masks, bool)
    ratio = None if ratios is None else np.asarray(ratios, np.float64)
    adv = np.zeros((T, N), np.float64)
    for n in range(N):
        boot, chain, carried, last = float(np.asarray(next_value, np.float64)[n]), 1.0, 0.0, 0.0
        for t in reversed(range(T)):
            ended = term[t, n] or trunc[t, n]
            end_boot = 0.0 if term[t, n] else fv[t, n]
            if not mask[t, n]:
                if ended:
                    boot, chain, carried, last = end_boot, 0.0, r[t, n], 0.0
                else:
                    carried += r[t, n]
                continue
            if ended:
                delta = r[t, n] + gamma * end_boot - v[t, n]
                chain = 0.0
            else:
                delta = r[t, n] + carried + gamma * boot - v[t, n]
            rho = c = 1.0
            if ratio is not None:
                rho, c = min(ratio[t, n], rho_clip), min(ratio[t, n], c_clip)
            adv[t, n] = rho * delta + gamma * gae_lambda * c * chain * last
            boot, chain, carried, last = v[t, n], 1.0, 0.0, adv[t, n]
    return adv


@numba.njit(cache=True, nogil=True)
def _advantages_kernel(values, rewards, terminals, truncations, final_values, next_value, masks, ratios,
                       gamma, gae_lambda, rho_clip, c_clip, use_masks, use_ratios, out):
    T, N = values.shape
    boot = next_value.astype(np.float32).copy()
    chain = np.ones(N, np.float32)
    carried = np.zeros(N, np.float32)
    last = np.zeros(N, np.float32)
    # Time outer, rows inner: each step reads contiguous rows of the (T, N) arrays.
    for t in range(T - 1, -1, -1):
        for n in range(N):
            ended = terminals[t, n] or truncations[t, n]
            end_boot = np.float32(0.0) if terminals[t, n] else final_values[t, n]
            if use_masks and not masks[t, n]:
                out[t, n] = 0.0
                if ended:
                    boot[n], chain[n], carried[n], last[n] = end_boot, 0.0, rewards[t, n], 0.0
                else:
                    carried[n] += rewards[t, n]
                continue
            if ended:
                delta = rewards[t, n] + gamma * end_boot - values[t, n]
                chain[n] = 0.0
            else:
                delta = rewards[t, n] + carried[n] + gamma * boot[n] - values[t, n]
            rho = np.float32(1.0)
            c = np.float32(1.0)
            if use_ratios:
                rho = min(ratios[t, n], rho_clip)
                c = min(ratios[t, n], c_clip)
            a = rho * delta + gamma * gae_lambda * c * chain[n] * last[n]
            out[t, n] = a
            boot[n], chain[n], carried[n], last[n] = values[t, n], 1.0, 0.0, a


@numba.njit("boolean(float32[:, ::1], float32[:, ::1], boolean[:, ::1], boolean[:, ::1], float32[:, ::1], "
            "float32[::1], float32, float32, float32[:, ::1])", cache=True, nogil=True)
def _gae_kernel(values, rewards, terminals, truncations, final_values, next_value, gamma, gae_lambda, out):
    """The recursion when every row acts and there are no ratios (single-agent envs, plain GAE): no chain
    or carried rewards to keep, and nothing read but the rollout itself. Typed for float32/bool C arrays
    only (anything else is refused by the dispatcher, and converted by the caller); False when shapes differ."""
    T, N = values.shape
    shape = values.shape
    if rewards.shape != shape or terminals.shape != shape or truncations.shape != shape \
            or final_values.shape != shape or out.shape != shape or next_value.shape[0] != N:
        return False
    boot = next_value.copy()
    last = np.zeros(N, np.float32)
    for t in range(T - 1, -1, -1):
        for n in range(N):
            if terminals[t, n]:
                delta, last[n] = rewards[t, n] - values[t, n], 0.0
            elif truncations[t, n]:
                delta, last[n] = rewards[t, n] + gamma * final_values[t, n] - values[t, n], 0.0
            else:
                delta = rewards[t, n] + gamma * boot[n] - values[t, n]
            last[n] = delta + gamma * gae_lambda * last[n]
            out[t, n] = last[n]
            boot[n] = values[t, n]
    return True


_NO_MASKS = np.ones((1, 1), np.bool_)  # stand-ins the kernel never reads (use_masks / use_ratios false):
_NO_RATIOS = np.ones((1, 1), np.float32)  # no (T, N) array is made per call when nothing is masked


def _as(a: Any, dtype: type) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dtype``: the array itself when it already is one."""
    if type(a) is np.ndarray and a.dtype == dtype and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=dtype)


def advantages_numba(values: np.ndarray, rewards: np.ndarray, terminals: np.ndarray, truncations: np.ndarray,
                     final_values: np.ndarray, next_value: np.ndarray, masks: np.ndarray | None = None,
                     gamma: float = 0.99, gae_lambda: float = 0.95, ratios: np.ndarray | None = None,
                     rho_clip: float = 1.0, c_clip: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
    """The Numba CPU kernel on numpy arrays (float32 math, no copies when inputs are float32/bool)."""
    f32, b = np.float32, np.bool_
    if masks is None and ratios is None and out is None and type(values) is np.ndarray and values.ndim == 2:
        # The plain case with nothing checked in Python: the typed kernel takes float32/bool C arrays
        # (else TypeError, and the general path below converts them) and checks the shapes itself.
        out = np.empty(values.shape, f32)
        try:
            if _gae_kernel(values, rewards, terminals, truncations, final_values, next_value, f32(gamma),
                           f32(gae_lambda), out):
                return out
        except TypeError:
            pass
    T, N = _check_shapes(values, rewards, terminals, truncations, final_values, next_value, masks, ratios)
    if out is None:
        out = np.empty((T, N), f32)
    rollout = (_as(values, f32), _as(rewards, f32), _as(terminals, b), _as(truncations, b), _as(final_values, f32),
               _as(next_value, f32))
    if masks is None and ratios is None:
        _gae_kernel(*rollout, f32(gamma), f32(gae_lambda), out)
    else:
        _advantages_kernel(*rollout, _NO_MASKS if masks is None else _as(masks, b),
                           _NO_RATIOS if ratios is None else _as(ratios, f32), f32(gamma), f32(gae_lambda),
                           f32(rho_clip), f32(c_clip), masks is not None, ratios is not None, out)
    return out


def advantages_cuda(values: torch.Tensor, rewards: torch.Tensor, terminals: torch.Tensor, truncations: torch.Tensor,
                    final_values: torch.Tensor, next_value: torch.Tensor, masks: torch.Tensor | None = None,
                    gamma: float = 0.99, gae_lambda: float = 0.95, ratios: torch.Tensor | None = None,
                    rho_clip: float = 1.0, c_clip: float = 1.0) -> torch.Tensor:
    """The same recursion on CUDA tensors: the Triton kernel (one thread per row, time in registers),
    or, where Triton is missing, a loop over time of row-parallel torch ops."""
    _check_shapes(values, rewards, terminals, truncations, final_values, next_value, masks, ratios)
    args = (values, rewards, terminals, truncations, final_values, next_value, masks, gamma, gae_lambda,
            ratios, rho_clip, c_clip)
    try:
        from packrl.train import _triton_advantage
    except ImportError:  # no Triton (not bundled with this torch build): stay on the GPU with torch ops
        return advantages_torch(*args)
    return _triton_advantage.advantages_triton(*args)


def advantages_torch(values: torch.Tensor, rewards: torch.Tensor, terminals: torch.Tensor, truncations: torch.Tensor,
                     final_values: torch.Tensor, next_value: torch.Tensor, masks: torch.Tensor | None = None,
                     gamma: float = 0.99, gae_lambda: float = 0.95, ratios: torch.Tensor | None = None,
                     rho_clip: float = 1.0, c_clip: float = 1.0) -> torch.Tensor:
    """Row-parallel torch ops looped over time, on any device (the GPU fallback and benchmark baseline)."""
    T, N = values.shape
    f = lambda a: a.to(torch.float32)  # noqa: E731
    v, r, fv = f(values), f(rewards), f(final_values)
    term, trunc = terminals.bool(), truncations.bool()
    mask = torch.ones_like(term) if masks is None else masks.bool()
    boot = f(next_value).clone()
    chain = torch.ones(N, device=v.device)
    carried = torch.zeros(N, device=v.device)
    last = torch.zeros(N, device=v.device)
    out = torch.empty((T, N), device=v.device)
    for t in range(T - 1, -1, -1):
        ended = term[t] | trunc[t]
        end_boot = torch.where(term[t], 0.0, fv[t])
        act = mask[t]
        delta = torch.where(ended, r[t] + gamma * end_boot - v[t], r[t] + carried + gamma * boot - v[t])
        rho = c = 1.0
        if ratios is not None:
            rho, c = f(ratios[t]).clamp(max=rho_clip), f(ratios[t]).clamp(max=c_clip)
        a = rho * delta + gamma * gae_lambda * c * torch.where(ended, 0.0, chain) * last
        out[t] = torch.where(act, a, 0.0)
        # Masked rows: an end re-seeds the chain, otherwise the reward is carried to the previous decision.
        skip_boot = torch.where(ended, end_boot, boot)
        boot = torch.where(act, v[t], skip_boot)
        chain = torch.where(act | ~ended, torch.where(act, 1.0, chain), 0.0)
        carried = torch.where(act, 0.0, torch.where(ended, r[t], carried + r[t]))
        last = torch.where(act, a, torch.where(ended, 0.0, last))
    return out


def compute_advantages(values: Any, rewards: Any, terminals: Any, truncations: Any, final_values: Any,
                       next_value: Any, masks: Any = None, gamma: float = 0.99, gae_lambda: float = 0.95,
                       ratios: Any = None, rho_clip: float = 1.0, c_clip: float = 1.0) -> Any:
    """Dispatch by where the data lives: CUDA tensors -> Triton, CPU tensors and numpy -> Numba.
    Returns float32 advantages of the input's kind (a CPU tensor shares memory with the kernel's output)."""
    args = (values, rewards, terminals, truncations, final_values, next_value, masks, gamma, gae_lambda,
            ratios, rho_clip, c_clip)
    if isinstance(values, torch.Tensor):
        if values.is_cuda:
            return advantages_cuda(*args)
        return torch.from_numpy(advantages_numba(*(_host(a) for a in args)))
    return advantages_numba(*args)


def cut_pending_decisions(values: torch.Tensor, rewards: torch.Tensor, terminals: torch.Tensor,
                          truncations: torch.Tensor, masks: torch.Tensor, next_value: torch.Tensor,
                          next_masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Turn-based bootstrapping: ``(masks, rewards, next_value)`` for the advantages of a rollout whose rows
    may be waiting when it ends.

    A row that does not act on the observation after the rollout (``next_masks`` false: an AEC agent waiting
    for its turn, a Parallel agent absent) holds a zero row there, and V(zero row) is not the value of its
    state. If its episode has not ended since its last decision in the rollout, that decision's outcome is
    not known yet: it is left out (masked, its rewards zeroed) and the row bootstraps from the value of the
    observation it acted on there, the observation that follows its previous decision. Its earlier
    decisions then get the plain GAE of a rollout that ended at that step. Rows that act after the rollout,
    or whose episode ended, are unchanged (single-agent rollouts: no change at all)."""
    if bool(next_masks.all()):
        return masks, rewards, next_value
    T = masks.shape[0]
    steps = torch.arange(T, device=masks.device)
    acted = masks.any(0)
    last = torch.where(masks, steps[:, None], -1).amax(0).clamp(min=0)  # each row's last decision
    ended = terminals | truncations
    ended_since = torch.flip(torch.cummax(torch.flip(ended.int(), (0,)), 0).values, (0,)).bool()  # an end at >= t
    pending = ~next_masks & acted & ~ended_since.gather(0, last[None]).squeeze(0)
    cut = pending[None, :] & (steps[:, None] >= last[None, :])
    bootstrap = values.gather(0, last[None]).squeeze(0)
    return masks & ~cut, torch.where(cut, 0.0, rewards), torch.where(pending, bootstrap, next_value)


def _host(a: Any) -> Any:
    """A CPU tensor's numpy view (no copy); anything else as it is."""
    if not isinstance(a, torch.Tensor):
        return a
    try:
        return a.numpy()
    except RuntimeError:  # a tensor that requires grad
        return a.detach().cpu().numpy()


def _check_shapes(values: Any, rewards: Any, terminals: Any, truncations: Any, final_values: Any,
                  next_value: Any, masks: Any, ratios: Any) -> tuple[int, int]:
    shape = tuple(values.shape)
    if len(shape) != 2:
        raise ValueError(f"advantages take (time, rows) arrays; values has shape {shape}")
    same = (rewards, terminals, truncations, final_values, masks, ratios)
    if any(a is not None and tuple(a.shape) != shape for a in same) or tuple(next_value.shape) != shape[1:]:
        named = dict(zip(("rewards", "terminals", "truncations", "final_values", "masks", "ratios"), same))
        for name, a in named.items():
            if a is not None and tuple(a.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(a.shape)}, values has {shape}")
        raise ValueError(f"next_value has shape {tuple(next_value.shape)}, expected ({shape[1]},)")
    return shape
