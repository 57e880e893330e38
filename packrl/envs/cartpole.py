"""CartPole as Numba kernels, with gymnasium CartPole-v1's dynamics operation for operation.

Same constants, the same Euler update in float64, the same termination thresholds, reward 1.0 on
every step (the terminating one included), float32 observations, and the 500-step truncation of
CartPole-v1's TimeLimit. Tests compare it with gymnasium transition by transition from identical
states. Only the reset draws differ (its own per-copy stream instead of gymnasium's np_random):
the same uniform(-0.05, 0.05) distribution.
"""
from __future__ import annotations

import ctypes
import math

import numpy as np
from gymnasium import spaces
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from packrl.envs.numba_env import NumbaEnv
from packrl.envs.rng import uniform

GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD_RADIANS = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
MAX_EPISODE_STEPS = 500

_HIGH = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD_RADIANS * 2, np.inf],
                 dtype=np.float32)


# The C library's sincos(x, &s, &c): sin and cos of one angle in one call, bit for bit what its sin and
# cos return (glibc computes all three with the same code), in about 60% of their time; the two calls
# are most of a CartPole step. Here rather than in a shared module so that the kernels' caches, keyed
# on this file's source, see a change to it. Without sincos (not glibc) the two calls are made.
HAS_SINCOS = hasattr(ctypes.CDLL(None), "sincos")


@intrinsic
def _libm_sincos(typingctx, x):  # noqa: ANN202 - Numba's intrinsic signature
    signature = types.UniTuple(types.float64, 2)(types.float64)

    def codegen(context, builder, sig, args):  # noqa: ANN202
        double = ir.DoubleType()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [double, double.as_pointer(), double.as_pointer()]), "sincos")
        sin, cos = cgutils.alloca_once(builder, double), cgutils.alloca_once(builder, double)
        builder.call(fn, [args[0], sin, cos])
        return context.make_tuple(builder, sig.return_type, [builder.load(sin), builder.load(cos)])

    return signature, codegen


@njit(cache=True)
def _one_call(x: float) -> tuple:
    return _libm_sincos(x)


@njit(cache=True)
def _two_calls(x: float) -> tuple:
    return np.sin(x), np.cos(x)


sincos = _one_call if HAS_SINCOS else _two_calls
"""``(sin(x), cos(x))`` of a float64 inside a kernel: one libm sincos call where there is one."""


@njit(cache=True)
def cartpole_dynamics(x: float, x_dot: float, theta: float, theta_dot: float, action: int) -> tuple:
    """One Euler step of CartPole-v1 in float64: the next (x, x_dot, theta, theta_dot) and terminated."""
    force = FORCE_MAG if action == 1 else -FORCE_MAG
    sintheta, costheta = sincos(theta)  # np.sin(theta), np.cos(theta), bit for bit
    temp = (force + POLEMASS_LENGTH * np.square(theta_dot) * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * np.square(costheta) / TOTAL_MASS))
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    x = x + TAU * x_dot
    x_dot = x_dot + TAU * xacc
    theta = theta + TAU * theta_dot
    theta_dot = theta_dot + TAU * thetaacc
    terminated = x < -X_THRESHOLD or x > X_THRESHOLD or theta < -THETA_THRESHOLD_RADIANS or theta > THETA_THRESHOLD_RADIANS
    return x, x_dot, theta, theta_dot, terminated


@njit(cache=True)
def _write_obs(physics: np.ndarray, obs: np.ndarray) -> None:
    for k in range(4):
        obs[k] = physics[k]  # float64 state -> float32 observation, as gymnasium's np.array(state, float32)


@njit(cache=True)
def reset(state, obs, rng) -> None:
    physics = state.physics
    for k in range(4):
        physics[k] = uniform(rng, -0.05, 0.05)
    _write_obs(physics, obs)


@njit(cache=True)
def step(state, action, obs, rng) -> tuple:
    p = state.physics
    x, x_dot, theta, theta_dot, terminated = cartpole_dynamics(p[0], p[1], p[2], p[3], action)
    p[0], p[1], p[2], p[3] = x, x_dot, theta, theta_dot
    _write_obs(p, obs)
    return 1.0, terminated, False


def spec() -> NumbaEnv:
    """CartPole-v1 as a NumbaEnv: Box(4,) float32 observation, Discrete(2) action, 500-step limit."""
    return NumbaEnv(
        name="cartpole",
        observation_space=spaces.Box(-_HIGH, _HIGH, dtype=np.float32),
        action_space=spaces.Discrete(2),
        state={"physics": (4, np.float64)},
        reset=reset,
        step=step,
        max_episode_steps=MAX_EPISODE_STEPS,
        description="gymnasium CartPole-v1 dynamics, batched in Numba",
    )
