"""Aim: a Dict observation with a MultiDiscrete leaf and a hybrid action (Discrete plus Box), so every head of
packrl's policies meets a Numba env.

A point moves in the square [0, 6]^2 towards a target cell. Observation (a Dict): ``target`` MultiDiscrete([7, 7]),
the target cell; ``position`` Box(0, 6, (2,)) float32, where the point is. Action (a Dict, hybrid): ``direction``
Discrete(4) (0 north/-row, 1 east/+col, 2 south/+row, 3 west/-col) and ``speed`` Box(0, 1, (1,)) float32, the
distance moved (walls stop it). Reward: the decrease of the distance to the target's centre, minus 0.02 per step,
plus 1.0 on arriving within ARRIVE of it (the episode terminates); episodes are truncated after 30 steps.

Reference mean episode returns (tests/test_numba_aim.py measures both on every run): the uniform random policy
about RANDOM_RETURN = -0.3, the greedy policy (along the axis with the larger gap, at most the gap) about GREEDY_RETURN = 4.1.
PPO with packrl's defaults passes LEARNED_THRESHOLD = 2.5 (greedy) within 200k steps on 16 copies (3.55-3.84 on
seeds 0-2; tests/test_numba_aim.py).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from numba import njit

from packrl.envs.numba_env import NumbaEnv
from packrl.envs.rng import randint, uniform

SIZE = 7
ARRIVE = 0.5
STEP_COST = 0.02
GOAL_REWARD = 1.0
MAX_EPISODE_STEPS = 30
RANDOM_RETURN = -0.3
GREEDY_RETURN = 4.1
LEARNED_THRESHOLD = 2.5

_MOVES = np.array([[-1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, -1.0]])


@njit(cache=True)
def _gap(state) -> float:
    dr = state.position[0] - state.target[0]
    dc = state.position[1] - state.target[1]
    return np.sqrt(dr * dr + dc * dc)


@njit(cache=True)
def _observe(state, obs) -> None:
    obs.target[0], obs.target[1] = state.target[0], state.target[1]
    obs.position[0], obs.position[1] = state.position[0], state.position[1]


@njit(cache=True)
def reset(state, obs, rng) -> None:
    state.target[0], state.target[1] = randint(rng, SIZE), randint(rng, SIZE)
    state.position[0], state.position[1] = uniform(rng, 0.0, SIZE - 1.0), uniform(rng, 0.0, SIZE - 1.0)
    _observe(state, obs)


@njit(cache=True)
def step(state, action, obs, rng) -> tuple:
    direction, speed = action.discrete[0], action.continuous[0]
    before = _gap(state)
    for d in range(2):
        state.position[d] = min(max(state.position[d] + speed * _MOVES[direction, d], 0.0), SIZE - 1.0)
    after = _gap(state)
    reward = before - after - STEP_COST
    terminated = after < ARRIVE
    if terminated:
        reward += GOAL_REWARD
    _observe(state, obs)
    return reward, terminated, False


def spec() -> NumbaEnv:
    """Aim as a NumbaEnv (Dict observation with a MultiDiscrete leaf, hybrid Dict action)."""
    return NumbaEnv(
        name="aim",
        observation_space=spaces.Dict({
            "target": spaces.MultiDiscrete([SIZE, SIZE]),
            "position": spaces.Box(0.0, SIZE - 1.0, (2,), np.float32),
        }),
        action_space=spaces.Dict({"direction": spaces.Discrete(4), "speed": spaces.Box(0.0, 1.0, (1,), np.float32)}),
        state={"target": (2, np.int64), "position": (2, np.float64)},
        reset=reset,
        step=step,
        max_episode_steps=MAX_EPISODE_STEPS,
        description="walk a point to a target cell: MultiDiscrete observation leaf, Discrete plus Box action",
    )
