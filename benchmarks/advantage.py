"""compute_advantages against a minimal Numba kernel of the same recursion (issue 19: within 1.3x).

The minimal kernel is the recursion of packrl/train/advantage.py with nothing else: terminals, truncations
with their final values, float32, no masks, no V-trace ratios, no checks, called on arrays already in
float32/bool, returning a new array as compute_advantages does. packrl's rows: ``compute_advantages`` on numpy
arrays and on CPU torch tensors (as PPO calls it), ``masks=None`` and a mask. Contenders alternate within each
round, so load changes hit them alike; the ratio is the median over rounds of (packrl / minimal) in the same
round. Times are process CPU time (``time.process_time``), which other jobs on a shared machine disturb less
than the wall clock.

    flock /tmp/cpu.lock .venv/bin/python benchmarks/advantage.py [--rounds 9]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np
import torch
from common import calls_per_batch, machine_line, print_table

from packrl.train.advantage import compute_advantages

SHAPES = ((128, 8), (128, 64), (256, 1024))  # (T, N): CleanRL's CartPole rollout, 64 envs, a large batch


@numba.njit(cache=True, nogil=True)
def minimal_kernel(values, rewards, terminals, truncations, final_values, next_value, gamma, gae_lambda):
    T, N = values.shape
    out = np.empty((T, N), np.float32)
    boot = next_value.copy()
    last = np.zeros(N, np.float32)
    for t in range(T - 1, -1, -1):  # time outer, rows inner: contiguous rows, as packrl's kernel reads them
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
    return out


def rollout(T: int, N: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ends = rng.random((T, N))
    return {"values": rng.standard_normal((T, N), np.float32), "rewards": rng.standard_normal((T, N), np.float32),
            "terminals": ends < 0.02, "truncations": (ends >= 0.02) & (ends < 0.03),
            "final_values": rng.standard_normal((T, N), np.float32), "next_value": rng.standard_normal(N, np.float32)}


GAMMA, LAMBDA = np.float32(0.99), np.float32(0.95)  # compute_advantages' defaults
ROLLOUT = ("values", "rewards", "terminals", "truncations", "final_values", "next_value")


def _contenders(a: dict, t: dict, masks: np.ndarray) -> dict:
    """The calls timed for one rollout: ``a`` its numpy arrays, ``t`` the same as CPU tensors."""
    return {
        "minimal Numba kernel": lambda: minimal_kernel(*(a[k] for k in ROLLOUT), GAMMA, LAMBDA),
        "compute_advantages, numpy": lambda: compute_advantages(*(a[k] for k in ROLLOUT)),
        "compute_advantages, torch CPU": lambda: compute_advantages(*(t[k] for k in ROLLOUT)),
        "compute_advantages, numpy, masks": lambda: compute_advantages(*(a[k] for k in ROLLOUT), masks=masks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_line())
    rows = []
    for T, N in SHAPES:
        a = rollout(T, N)
        t = {k: torch.from_numpy(v) for k, v in a.items()}
        masks = np.random.default_rng(1).random((T, N)) < 0.9
        want = minimal_kernel(*(a[k] for k in ROLLOUT), GAMMA, LAMBDA)
        np.testing.assert_allclose(compute_advantages(*(a[k] for k in ROLLOUT)), want, rtol=1e-5, atol=1e-5)
        contenders = _contenders(a, t, masks)
        batch = {name: calls_per_batch(fn, 0.02) for name, fn in contenders.items()}
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                start = time.process_time()
                for _ in range(batch[name]):
                    fn()
                samples[name].append((time.process_time() - start) / batch[name] * 1e6)
        base = samples["minimal Numba kernel"]
        for name, us in samples.items():
            ratio = statistics.median(x / b for x, b in zip(us, base))
            rows.append([f"{T}x{N}", name, statistics.median(us), max(us) - min(us), f"{ratio:.2f}x"])
    print_table(f"advantages, microseconds per call, median of {args.rounds} interleaved rounds",
                ["T x N", "contender", "us per call", "spread", "vs minimal (paired median)"], rows)
    print("target (issue 19): compute_advantages with masks=None within 1.3x of the minimal kernel")


if __name__ == "__main__":
    main()
