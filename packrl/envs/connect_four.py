"""PettingZoo classic's ``connect_four_v3`` as turn-based Numba kernels: two players drop pieces in turns.

The same game as ``pettingzoo.classic.connect_four_v3.env()``: a 6x7 board, ``player_0`` moves first, a Discrete(7)
action drops the mover's piece into a column; four in a row (across, down or either diagonal) wins (+1 to the
winner, -1 to the other), a full board is a draw (0 each), and a move into a full column ends the game with -1 to
the mover and 0 to the other (PettingZoo's TerminateIllegalWrapper). Each agent observes ``observation`` (6, 7, 2)
int8, its own pieces then the other's, and ``action_mask`` (7,) int8, the columns not full. Rows, masks and rewards
are those of ``vector.make(connect_four_v3.env, n)``: only the mover's row is shown, and the game's end reaches both
rows in the same step (tests/test_numba_connect_four.py compares them move by move).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from numba import njit

from packrl.envs.numba_env import NumbaEnv

ROWS, COLS = 6, 7
AGENTS = ("player_0", "player_1")


@njit(cache=True)
def _observe(state, obs) -> None:
    board = state.board
    for p in range(2):
        mine, theirs = p + 1, 2 - p
        for r in range(ROWS):
            for c in range(COLS):
                cell = board[r * COLS + c]
                obs.observation[p, r, c, 0] = 1 if cell == mine else 0
                obs.observation[p, r, c, 1] = 1 if cell == theirs else 0
        for c in range(COLS):
            obs.action_mask[p, c] = 1 if board[c] == 0 else 0


@njit(cache=True)
def _wins(board, piece: int) -> bool:
    for r in range(ROWS):
        for c in range(COLS):
            if board[r * COLS + c] != piece:
                continue
            right = c + 3 < COLS
            down = r + 3 < ROWS
            up = r - 3 >= 0
            if right and board[r * COLS + c + 1] == piece and board[r * COLS + c + 2] == piece \
                    and board[r * COLS + c + 3] == piece:
                return True
            if down and board[(r + 1) * COLS + c] == piece and board[(r + 2) * COLS + c] == piece \
                    and board[(r + 3) * COLS + c] == piece:
                return True
            if right and down and board[(r + 1) * COLS + c + 1] == piece and board[(r + 2) * COLS + c + 2] == piece \
                    and board[(r + 3) * COLS + c + 3] == piece:
                return True
            if right and up and board[(r - 1) * COLS + c + 1] == piece and board[(r - 2) * COLS + c + 2] == piece \
                    and board[(r - 3) * COLS + c + 3] == piece:
                return True
    return False


@njit(cache=True)
def reset(state, obs, live, rng) -> None:
    for k in range(ROWS * COLS):
        state.board[k] = 0
    state.mover[0] = 0
    live[0], live[1] = True, False
    _observe(state, obs)


@njit(cache=True)
def step(state, actions, obs, rewards, terminated, truncated, live, rng) -> None:
    board, me = state.board, state.mover[0]
    other = 1 - me
    column = actions[me]
    if board[column] != 0:  # a full column: the mover loses the game
        rewards[me] = -1.0
        terminated[0], terminated[1] = True, True
    else:
        for r in range(ROWS - 1, -1, -1):
            if board[r * COLS + column] == 0:
                board[r * COLS + column] = me + 1
                break
        if _wins(board, me + 1):
            rewards[me], rewards[other] = 1.0, -1.0
            terminated[0], terminated[1] = True, True
        else:
            full = True
            for c in range(COLS):
                full = full and board[c] != 0
            terminated[0], terminated[1] = full, full
    state.mover[0] = other
    live[me], live[other] = False, True
    _observe(state, obs)


def spec() -> NumbaEnv:
    """connect_four_v3 as a turn-based NumbaEnv with 2 agents."""
    return NumbaEnv(
        name="connect_four",
        observation_space=spaces.Dict({
            "observation": spaces.Box(0, 1, (ROWS, COLS, 2), np.int8),
            "action_mask": spaces.Box(0, 1, (COLS,), np.int8),
        }),
        action_space=spaces.Discrete(COLS),
        state={"board": (ROWS * COLS, np.int64), "mover": (1, np.int64)},
        reset=reset,
        step=step,
        agents=AGENTS,
        turns=True,
        description="PettingZoo classic connect_four_v3: two players, alternating moves, action masks",
    )
