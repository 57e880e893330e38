"""MPE2's ``simple_tag_v3`` (3 adversaries chase 1 good agent around 2 obstacles) as Numba kernels, with agents
whose observation spaces differ: packrl's first Numba env with two agent groups.

The same world as ``mpe2.simple_tag_v3.parallel_env()`` with its defaults (num_good=1, num_adversaries=3,
num_obstacles=2, max_cycles=25, discrete actions): each agent's Discrete(5) action pushes it along one axis (0
none, 1 -x, 2 +x, 3 -y, 4 +y) with its own acceleration (adversaries 3, the good agent 4); every pair of agents, and
each agent with each obstacle, push apart by MPE's softened contact force (obstacles do not move); positions then
velocities are integrated with dt 0.1 and damping 0.25, and each speed is capped (adversaries 1.0, the good agent
1.3), in float64. Rewards: every adversary gets +10 for each adversary touching the good agent; the good agent
gets -10 for each adversary touching it and a penalty for leaving the square [-0.9, 0.9]^2. Observations (float32):
own velocity, own position, the obstacles' and the other agents' positions relative to it, and (adversaries only)
the good agent's velocity: (16,) for an adversary, (14,) for the good agent. All agents are truncated after 25
steps. tests/test_numba_simple_tag.py compares it with mpe2 transition by transition from copied states; only the
reset draws differ (the copy's own stream instead of mpe2's np_random: the same uniform ranges).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from numba import njit

from packrl.envs.mpe_physics import action_force, contact_push, integrate
from packrl.envs.numba_env import NumbaEnv
from packrl.envs.rng import uniform

ADVERSARIES = 3
GOOD = 1
N = ADVERSARIES + GOOD  # agents: the adversaries first, as mpe2 orders them
OBSTACLES = 2
AGENTS = tuple(f"adversary_{i}" for i in range(ADVERSARIES)) + tuple(f"agent_{i}" for i in range(GOOD))
MAX_CYCLES = 25
SIZES = np.array([0.075] * ADVERSARIES + [0.05] * GOOD)
ACCEL = np.array([3.0] * ADVERSARIES + [4.0] * GOOD)
MAX_SPEED = np.array([1.0] * ADVERSARIES + [1.3] * GOOD)
OBSTACLE_SIZE = 0.2
CATCH_REWARD = 10.0
ADVERSARY_OBS = 4 + 2 * OBSTACLES + 2 * (N - 1) + 2 * GOOD
GOOD_OBS = 4 + 2 * OBSTACLES + 2 * (N - 1) + 2 * (GOOD - 1)


@njit(cache=True)
def _touching(pos, a: int, b: int) -> bool:
    dx, dy = pos[a, 0] - pos[b, 0], pos[a, 1] - pos[b, 1]
    return np.sqrt(dx * dx + dy * dy) < SIZES[a] + SIZES[b]


@njit(cache=True)
def _bound(x: float) -> float:
    """The good agent's penalty for being ``x`` from the centre along one axis (mpe2's ``bound``)."""
    if x < 0.9:
        return 0.0
    if x < 1.0:
        return (x - 0.9) * 10
    return min(np.exp(2 * x - 2), 10.0)


@njit(cache=True)
def _observe_one(state, a: int, o) -> None:
    pos, vel, marks = state.pos, state.vel, state.obstacles
    o[0], o[1], o[2], o[3] = vel[a, 0], vel[a, 1], pos[a, 0], pos[a, 1]
    k = 4
    for m in range(OBSTACLES):
        o[k], o[k + 1] = marks[m, 0] - pos[a, 0], marks[m, 1] - pos[a, 1]
        k += 2
    for b in range(N):
        if b != a:
            o[k], o[k + 1] = pos[b, 0] - pos[a, 0], pos[b, 1] - pos[a, 1]
            k += 2
    for b in range(ADVERSARIES, N):  # the other good agents' velocities
        if b != a:
            o[k], o[k + 1] = vel[b, 0], vel[b, 1]
            k += 2


@njit(cache=True)
def _observe(state, obs) -> None:
    adversaries, good = obs
    for a in range(ADVERSARIES):
        _observe_one(state, a, adversaries[a])
    for g in range(GOOD):
        _observe_one(state, ADVERSARIES + g, good[g])


@njit(cache=True)
def reset(state, obs, live, rng) -> None:
    for a in range(N):
        state.pos[a, 0], state.pos[a, 1] = uniform(rng, -1.0, 1.0), uniform(rng, -1.0, 1.0)
        state.vel[a, 0], state.vel[a, 1] = 0.0, 0.0
    for m in range(OBSTACLES):
        state.obstacles[m, 0], state.obstacles[m, 1] = uniform(rng, -0.9, 0.9), uniform(rng, -0.9, 0.9)
    _observe(state, obs)


@njit(cache=True)
def step(state, actions, obs, rewards, terminated, truncated, live, rng) -> None:
    pos, vel, force, marks = state.pos, state.vel, state.force, state.obstacles
    for a in range(N):
        action_force(force, a, actions[a], ACCEL[a])
    for a in range(N):  # contact forces in mpe2's order: each agent with the later agents, then the obstacles
        for b in range(a + 1, N):
            fx, fy = contact_push(pos, a, pos[b, 0], pos[b, 1], SIZES[a] + SIZES[b])
            force[a, 0], force[a, 1] = fx + force[a, 0], fy + force[a, 1]
            force[b, 0], force[b, 1] = -fx + force[b, 0], -fy + force[b, 1]
        for m in range(OBSTACLES):
            fx, fy = contact_push(pos, a, marks[m, 0], marks[m, 1], SIZES[a] + OBSTACLE_SIZE)
            force[a, 0], force[a, 1] = fx + force[a, 0], fy + force[a, 1]
    for a in range(N):
        integrate(pos, vel, force, a)
        speed = np.sqrt(np.square(vel[a, 0]) + np.square(vel[a, 1]))
        if speed > MAX_SPEED[a]:
            vel[a, 0], vel[a, 1] = vel[a, 0] / speed * MAX_SPEED[a], vel[a, 1] / speed * MAX_SPEED[a]
    catches = 0.0
    for g in range(ADVERSARIES, N):
        for a in range(ADVERSARIES):
            if _touching(pos, g, a):
                catches += CATCH_REWARD
    for a in range(ADVERSARIES):
        rewards[a] = catches
    for g in range(ADVERSARIES, N):
        own = 0.0
        for a in range(ADVERSARIES):
            if _touching(pos, a, g):
                own -= CATCH_REWARD
        for d in range(2):
            own -= _bound(abs(pos[g, d]))
        rewards[g] = own
    _observe(state, obs)


def _box(size: int) -> spaces.Box:
    return spaces.Box(-np.float32(np.inf), np.float32(np.inf), (size,), np.float32)


def spec() -> NumbaEnv:
    """simple_tag_v3 with its defaults as a NumbaEnv with 4 agents in two groups (adversaries, the good agent)."""
    return NumbaEnv(
        name="simple_tag",
        observation_space={agent: _box(ADVERSARY_OBS if agent.startswith("adversary") else GOOD_OBS) for agent in AGENTS},
        action_space=spaces.Discrete(5),
        state={"pos": ((N, 2), np.float64), "vel": ((N, 2), np.float64), "obstacles": ((OBSTACLES, 2), np.float64),
               "force": ((N, 2), np.float64)},
        reset=reset,
        step=step,
        max_episode_steps=MAX_CYCLES,
        agents=AGENTS,
        description="MPE2 simple_tag_v3: 3 adversaries chase 1 good agent (two observation spaces)",
    )
