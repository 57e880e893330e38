"""MPE2's ``simple_spread_v3`` (3 agents, 3 landmarks, cooperative) as Numba kernels, with agents.

The same world as ``mpe2.simple_spread_v3.parallel_env()`` with its defaults (N=3, local_ratio=0.5,
max_cycles=25, discrete actions): each agent's Discrete(5) action pushes it with force 5 along one axis
(0 none, 1 -x, 2 +x, 3 -y, 4 +y); agents closer than 0.3 push each other apart (MPE's softened contact force);
positions then velocities are integrated with dt 0.1 and damping 0.25, in float64. Each agent's reward is
half the shared ``-sum over landmarks of the nearest agent's distance`` plus half ``-1`` per other agent it
overlaps. Observation (18,) float32: own velocity, own position, the landmarks' and the other agents'
positions relative to it, and 4 zeros (the silent agents' communication). All agents are truncated after 25
steps. tests/test_numba_simple_spread.py compares it with mpe2 transition by transition from copied states;
only the reset draws differ (the copy's own stream instead of mpe2's np_random: the same uniform(-1, 1)).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from numba import njit

from packrl.envs.mpe_physics import action_force, contact_push, integrate
from packrl.envs.numba_env import NumbaEnv
from packrl.envs.rng import uniform

N = 3  # agents, and landmarks
AGENTS = tuple(f"agent_{i}" for i in range(N))
MAX_CYCLES = 25
LOCAL_RATIO = 0.5
SIZE = 0.15  # every agent's radius
SENSITIVITY = 5.0
OBS_SIZE = 4 + 2 * N + 2 * (N - 1) + 2 * (N - 1)


@njit(cache=True)
def _dist(ax: float, ay: float, bx: float, by: float) -> float:
    return np.sqrt(np.square(ax - bx) + np.square(ay - by))


@njit(cache=True)
def _observe(state, obs) -> None:
    pos, vel, marks = state.pos, state.vel, state.landmarks
    for a in range(N):
        o = obs[a]
        o[0], o[1], o[2], o[3] = vel[a, 0], vel[a, 1], pos[a, 0], pos[a, 1]
        k = 4
        for m in range(N):
            o[k], o[k + 1] = marks[m, 0] - pos[a, 0], marks[m, 1] - pos[a, 1]
            k += 2
        for b in range(N):
            if b != a:
                o[k], o[k + 1] = pos[b, 0] - pos[a, 0], pos[b, 1] - pos[a, 1]
                k += 2
        for j in range(2 * (N - 1)):
            o[k + j] = 0.0  # communication of silent agents: zeros


@njit(cache=True)
def reset(state, obs, live, rng) -> None:
    for a in range(N):
        state.pos[a, 0], state.pos[a, 1] = uniform(rng, -1.0, 1.0), uniform(rng, -1.0, 1.0)
        state.vel[a, 0], state.vel[a, 1] = 0.0, 0.0
    for m in range(N):
        state.landmarks[m, 0], state.landmarks[m, 1] = uniform(rng, -1.0, 1.0), uniform(rng, -1.0, 1.0)
    _observe(state, obs)


@njit(cache=True)
def step(state, actions, obs, rewards, terminated, truncated, live, rng) -> None:
    pos, vel, force = state.pos, state.vel, state.force
    for a in range(N):
        action_force(force, a, actions[a], SENSITIVITY)
    for a in range(N):  # contact forces between agents (landmarks do not collide), pairs in mpe2's order
        for b in range(a + 1, N):
            fx, fy = contact_push(pos, a, pos[b, 0], pos[b, 1], 2 * SIZE)
            force[a, 0], force[a, 1] = fx + force[a, 0], fy + force[a, 1]
            force[b, 0], force[b, 1] = -fx + force[b, 0], -fy + force[b, 1]
    for a in range(N):
        integrate(pos, vel, force, a)
    shared = 0.0
    for m in range(N):
        nearest = np.inf
        for a in range(N):
            nearest = min(nearest, _dist(pos[a, 0], pos[a, 1], state.landmarks[m, 0], state.landmarks[m, 1]))
        shared -= nearest
    for a in range(N):
        own = 0.0
        for b in range(N):
            if b != a and _dist(pos[a, 0], pos[a, 1], pos[b, 0], pos[b, 1]) < 2 * SIZE:
                own -= 1.0
        rewards[a] = shared * (1 - LOCAL_RATIO) + own * LOCAL_RATIO
    _observe(state, obs)


def spec() -> NumbaEnv:
    """simple_spread_v3 with its defaults as a NumbaEnv with 3 agents."""
    return NumbaEnv(
        name="simple_spread",
        observation_space=spaces.Box(-np.float32(np.inf), np.float32(np.inf), (OBS_SIZE,), np.float32),
        action_space=spaces.Discrete(5),
        state={"pos": ((N, 2), np.float64), "vel": ((N, 2), np.float64), "landmarks": ((N, 2), np.float64),
               "force": ((N, 2), np.float64)},
        reset=reset,
        step=step,
        max_episode_steps=MAX_CYCLES,
        agents=AGENTS,
        description="MPE2 simple_spread_v3: 3 agents cover 3 landmarks",
    )
