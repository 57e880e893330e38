"""The Triton CUDA advantage kernel (imported only when Triton is present; it ships with CUDA builds of torch).

Why Triton: it comes with every CUDA torch wheel (no extra dependency, no compiler on the user's
machine), reads torch tensors in place on the training device, and the recursion is a scan over
time that is independent per row, so one program per block of rows keeping its carry in registers
is the whole design. The same source runs under ``TRITON_INTERPRET=1`` on CPU, which is how it is
checked on machines without a GPU (see benchmarks/gpu_check.py --interpret).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 256


@triton.jit
def _advantage_kernel(values, rewards, terminals, truncations, final_values, next_value, masks, ratios, out,
                      T, N, gamma, gae_lambda, rho_clip, c_clip,
                      HAS_MASKS: tl.constexpr, HAS_RATIOS: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = cols < N
    boot = tl.load(next_value + cols, mask=inside, other=0.0).to(tl.float32)
    chain = tl.full((BLOCK_N,), 1.0, tl.float32)
    carried = tl.zeros((BLOCK_N,), tl.float32)
    last = tl.zeros((BLOCK_N,), tl.float32)
    for i in range(T):
        t = T - 1 - i
        at = t * N + cols
        v = tl.load(values + at, mask=inside, other=0.0).to(tl.float32)
        r = tl.load(rewards + at, mask=inside, other=0.0).to(tl.float32)
        term = tl.load(terminals + at, mask=inside, other=0) != 0
        trunc = tl.load(truncations + at, mask=inside, other=0) != 0
        fv = tl.load(final_values + at, mask=inside, other=0.0).to(tl.float32)
        if HAS_MASKS:
            act = tl.load(masks + at, mask=inside, other=0) != 0
        else:
            act = inside
        ended = term | trunc
        end_boot = tl.where(term, 0.0, fv)
        delta = tl.where(ended, r + gamma * end_boot - v, r + carried + gamma * boot - v)
        if HAS_RATIOS:
            ratio = tl.load(ratios + at, mask=inside, other=1.0).to(tl.float32)
            rho = tl.minimum(ratio, rho_clip)
            c = tl.minimum(ratio, c_clip)
        else:
            rho = 1.0
            c = 1.0
        a = rho * delta + gamma * gae_lambda * c * tl.where(ended, 0.0, chain) * last
        tl.store(out + at, tl.where(act, a, 0.0), mask=inside)
        # A masked step is transparent: an end there re-seeds the chain, a reward is carried back.
        boot = tl.where(act, v, tl.where(ended, end_boot, boot))
        chain = tl.where(act, 1.0, tl.where(ended, 0.0, chain))
        carried = tl.where(act, 0.0, tl.where(ended, r, carried + r))
        last = tl.where(act, a, tl.where(ended, 0.0, last))


def advantages_triton(values: torch.Tensor, rewards: torch.Tensor, terminals: torch.Tensor,
                      truncations: torch.Tensor, final_values: torch.Tensor, next_value: torch.Tensor,
                      masks: torch.Tensor | None, gamma: float, gae_lambda: float, ratios: torch.Tensor | None,
                      rho_clip: float, c_clip: float) -> torch.Tensor:
    """Launch one program per BLOCK rows; bool inputs are read as bytes (a view, no copy)."""
    T, N = values.shape
    c = lambda a: a.contiguous()  # noqa: E731
    u8 = lambda a: a.contiguous().view(torch.uint8) if a.dtype == torch.bool else a.contiguous()  # noqa: E731
    out = torch.empty((T, N), dtype=torch.float32, device=values.device)
    grid = (triton.cdiv(N, BLOCK),)
    _advantage_kernel[grid](
        c(values), c(rewards), u8(terminals), u8(truncations), c(final_values), c(next_value),
        u8(masks) if masks is not None else out, c(ratios) if ratios is not None else out, out,
        T, N, float(gamma), float(gae_lambda), float(rho_clip), float(c_clip),
        HAS_MASKS=masks is not None, HAS_RATIOS=ratios is not None, BLOCK_N=BLOCK)
    return out
