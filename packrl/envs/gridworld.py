"""A small structured gridworld: the quick learning check for packrl's PPO.

A 5x5 room, an agent and a goal placed at random cells. Observation (a Dict):
``image`` (5, 5, 2) uint8, 255 where the agent (channel 0) and the goal (channel 1) are;
``position`` the agent's (row, col), int64 in [0, 4]; ``direction`` Discrete(4) the way it faces
(0 north, 1 east, 2 south, 3 west). Action MultiDiscrete([4, 2]): the heading to face, and
whether to step one cell that way (walls stop it). Reward: 1.0 on reaching the goal (the
episode terminates), plus 0.1 per cell the step brings the agent closer (minus 0.1 per cell
farther) and -0.01 per step; episodes are truncated after 24 steps.

Only the image shows where the goal is, so a policy must read it. Reference mean episode
returns (tests/test_numba_envs.py measures both on every run): the uniform random policy gets
about RANDOM_RETURN = 0.09 (it reaches the goal in a quarter of its episodes), the greedy
shortest-path policy about GREEDY_RETURN = 1.30. A policy whose mean episode return is at least
LEARNED_THRESHOLD = 0.8 walks to the goal; a random one stays far below it.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from numba import njit

from packrl.envs.numba_env import NumbaEnv
from packrl.envs.rng import randint

SIZE = 5
MAX_EPISODE_STEPS = 24
GOAL_REWARD = 1.0
SHAPING = 0.1
STEP_COST = 0.01
RANDOM_RETURN = 0.09
GREEDY_RETURN = 1.30
LEARNED_THRESHOLD = 0.8

_MOVES = np.array([[-1, 0], [0, 1], [1, 0], [0, -1]], dtype=np.int64)  # north, east, south, west


@njit(cache=True)
def _distance(agent: np.ndarray, goal: np.ndarray) -> int:
    return abs(agent[0] - goal[0]) + abs(agent[1] - goal[1])


@njit(cache=True)
def _draw(state, obs) -> None:
    obs.image[:] = 0
    obs.image[state.agent[0], state.agent[1], 0] = 255
    obs.image[state.goal[0], state.goal[1], 1] = 255
    obs.position[0] = state.agent[0]
    obs.position[1] = state.agent[1]
    obs.direction[0] = state.direction[0]


@njit(cache=True)
def reset(state, obs, rng) -> None:
    cell = randint(rng, SIZE * SIZE)
    other = randint(rng, SIZE * SIZE - 1)
    other = other + 1 if other >= cell else other  # any cell but the agent's, uniformly
    state.agent[0], state.agent[1] = cell // SIZE, cell % SIZE
    state.goal[0], state.goal[1] = other // SIZE, other % SIZE
    state.direction[0] = randint(rng, 4)
    _draw(state, obs)


@njit(cache=True)
def step(state, action, obs, rng) -> tuple:
    heading, move = action[0], action[1]
    before = _distance(state.agent, state.goal)
    state.direction[0] = heading
    if move == 1:
        row = min(max(state.agent[0] + _MOVES[heading, 0], 0), SIZE - 1)
        col = min(max(state.agent[1] + _MOVES[heading, 1], 0), SIZE - 1)
        state.agent[0], state.agent[1] = row, col
    after = _distance(state.agent, state.goal)
    reward = SHAPING * (before - after) - STEP_COST
    terminated = after == 0
    if terminated:
        reward += GOAL_REWARD
    _draw(state, obs)
    return reward, terminated, False


def spec() -> NumbaEnv:
    """The gridworld as a NumbaEnv (Dict observation, MultiDiscrete action)."""
    return NumbaEnv(
        name="gridworld",
        observation_space=spaces.Dict({
            "image": spaces.Box(0, 255, (SIZE, SIZE, 2), np.uint8),
            "position": spaces.Box(0, SIZE - 1, (2,), np.int64),
            "direction": spaces.Discrete(4),
        }),
        action_space=spaces.MultiDiscrete([4, 2]),
        state={"agent": (2, np.int64), "goal": (2, np.int64), "direction": (1, np.int64)},
        reset=reset,
        step=step,
        max_episode_steps=MAX_EPISODE_STEPS,
        description="5x5 room, walk to the goal shown in the image",
    )
