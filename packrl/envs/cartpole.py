"""CartPole as Numba kernels, with gymnasium CartPole-v1's dynamics operation for operation.

Same constants, the same Euler update in float64, the same termination thresholds, reward 1.0 on
every step (the terminating one included), float32 observations, and the 500-step truncation of
CartPole-v1's TimeLimit. Tests compare it with gymnasium transition by transition from identical
states. Only the reset draws differ (its own per-copy stream instead of gymnasium's np_random):
the same uniform(-0.05, 0.05) distribution.
"""
from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces
from numba import njit

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


@njit(cache=True)
def cartpole_dynamics(x: float, x_dot: float, theta: float, theta_dot: float, action: int) -> tuple:
    """One Euler step of CartPole-v1 in float64: the next (x, x_dot, theta, theta_dot) and terminated."""
    force = FORCE_MAG if action == 1 else -FORCE_MAG
    costheta = np.cos(theta)
    sintheta = np.sin(theta)
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
