"""The Numba CartPole's one-call sin and cos (packrl.envs.cartpole.sincos) is bit for bit the C
library's sin and cos, which gymnasium's CartPole uses (through NumPy): the dynamics stay exact."""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from packrl.envs.cartpole import HAS_SINCOS, _two_calls, sincos


@njit
def _both(xs, out):
    for i in range(xs.shape[0]):
        out[i, 0], out[i, 1] = sincos(xs[i])


def _bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=64))
def test_sincos_is_sin_and_cos_bit_for_bit(values):
    xs = np.array(values, np.float64)
    out = np.zeros((len(xs), 2))
    _both(xs, out)
    for x, (s, c) in zip(xs.tolist(), out.tolist()):
        want_s = math.sin(x) if math.isfinite(x) else float("nan")
        want_c = math.cos(x) if math.isfinite(x) else float("nan")
        if math.isnan(want_s):
            assert math.isnan(s) and math.isnan(c)
        else:
            assert (_bits(s), _bits(c)) == (_bits(want_s), _bits(want_c)), x


def test_sincos_over_cartpoles_angles_and_beyond():
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-0.25, 0.25, 100_000), rng.uniform(-7, 7, 50_000), rng.normal(0, 1e6, 10_000)])
    out = np.zeros((len(xs), 2))
    ref = np.array([(math.sin(x), math.cos(x)) for x in xs.tolist()])  # the C library's, as Python calls it
    _both(xs, out)
    assert np.array_equal(out.view(np.int64), ref.view(np.int64))
    assert _two_calls(0.5) == (np.sin(0.5), np.cos(0.5))
    assert HAS_SINCOS or sincos is _two_calls
