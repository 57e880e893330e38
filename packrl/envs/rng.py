"""Per-env random streams for Numba envs: xoshiro256** seeded through splitmix64.

Each env copy owns a ``(4,)`` uint64 state row, so copies never share a stream and a seed
reproduces a run in any process, serial or threaded. Seeding copy ``j`` with ``seed + j``
through splitmix64 gives uncorrelated streams even for consecutive seeds.
Call these from inside an env's ``reset``/``step`` kernels: ``random(rng)``, ``randint(rng, n)``,
``uniform(rng, low, high)``, ``normal(rng)``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

RNG_WORDS = 4
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_U53 = 1.0 / 9007199254740992.0  # 2**-53


@njit(cache=True)
def _rotl(x: np.uint64, k: int) -> np.uint64:
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(cache=True)
def seed_rng(rng: np.ndarray, seed: int) -> None:
    """Fill one ``(4,)`` uint64 stream state from an integer seed (splitmix64)."""
    x = np.uint64(np.int64(seed))
    for k in range(RNG_WORDS):
        x = x + _GOLDEN
        z = x
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        rng[k] = z ^ (z >> np.uint64(31))


@njit(cache=True)
def next_u64(rng: np.ndarray) -> np.uint64:
    """The next 64 random bits of the stream (xoshiro256**)."""
    result = _rotl(rng[1] * np.uint64(5), 7) * np.uint64(9)
    t = rng[1] << np.uint64(17)
    rng[2] ^= rng[0]
    rng[3] ^= rng[1]
    rng[1] ^= rng[2]
    rng[0] ^= rng[3]
    rng[2] ^= t
    rng[3] = _rotl(rng[3], 45)
    return result


@njit(cache=True)
def random(rng: np.ndarray) -> float:
    """A float64 uniform in [0, 1) with 53 random bits."""
    return float(next_u64(rng) >> np.uint64(11)) * _U53


@njit(cache=True)
def randint(rng: np.ndarray, n: int) -> int:
    """An int64 uniform in [0, n)."""
    return np.int64(random(rng) * n)


@njit(cache=True)
def uniform(rng: np.ndarray, low: float, high: float) -> float:
    """A float64 uniform in [low, high)."""
    return low + (high - low) * random(rng)


@njit(cache=True)
def normal(rng: np.ndarray) -> float:
    """A standard normal float64 (Box-Muller)."""
    u = 1.0 - random(rng)  # in (0, 1]: log is finite
    return np.sqrt(-2.0 * np.log(u)) * np.cos(2.0 * np.pi * random(rng))
