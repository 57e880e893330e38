"""A replay buffer that stores each observation once, a discount instead of a done, and samples n-step
transitions.

Each row (agent) is its own stream of slots, dm_env style: a slot holds the observation an action was
taken at, the action, the reward that followed, and the discount to the next slot (``gamma``, or 0 after a
termination). When an episode ends, the ended episode's final observation is written as one more slot
that starts no transition (``last``), so a truncation bootstraps from it with discount ``gamma`` and the
next episode's first observation is never used as the successor. No observation is stored twice:
the successor of slot i is slot i + 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class NStepBatch:
    """``returns`` = sum of discounted rewards over ``steps`` slots; the target is
    ``returns + discounts * V(next_observations)`` (``discounts`` is 0 after a termination)."""

    observations: np.ndarray
    actions: np.ndarray
    returns: np.ndarray
    discounts: np.ndarray
    next_observations: np.ndarray
    steps: np.ndarray
    rows: np.ndarray


class ReplayBuffer:
    """``capacity`` slots per row for ``num_rows`` rows (the vector env's agents)."""

    def __init__(self, capacity: int, num_rows: int, observation_shape: tuple, observation_dtype: Any,
                 action_shape: tuple = (), action_dtype: Any = np.int64, gamma: float = 0.99, seed: int | None = None):
        if capacity < 2:
            raise ValueError(f"capacity must hold at least 2 slots per row, got {capacity}")
        self.capacity, self.num_rows, self.gamma = capacity, num_rows, float(gamma)
        self.observations = np.zeros((capacity, num_rows, *observation_shape), observation_dtype)
        self.actions = np.zeros((capacity, num_rows, *action_shape), action_dtype)
        self.rewards = np.zeros((capacity, num_rows), np.float32)
        self.discounts = np.zeros((capacity, num_rows), np.float32)
        self.last = np.zeros((capacity, num_rows), bool)
        self.ptr = np.zeros(num_rows, np.int64)  # next physical slot to write, per row
        self.count = np.zeros(num_rows, np.int64)  # slots held, per row
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return int(self.count.sum())

    def add(self, observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminals: np.ndarray,
            truncations: np.ndarray, final_observations: np.ndarray, masks: np.ndarray | None = None) -> None:
        """One vector-env step: ``observations`` the actions were taken at, then what the step returned.
        Masked rows (absent agents) write nothing."""
        rows = np.arange(self.num_rows) if masks is None else np.flatnonzero(masks)
        ended = (np.asarray(terminals) | np.asarray(truncations))[rows]
        self._write(rows, observations[rows], actions[rows], rewards[rows],
                    np.where(np.asarray(terminals)[rows], 0.0, self.gamma), last=False)
        done = rows[ended]
        if done.size:
            self._write(done, final_observations[done], np.zeros_like(actions[done]), np.zeros(done.size),
                        np.zeros(done.size), last=True)

    def _write(self, rows: np.ndarray, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
               discounts: np.ndarray, last: bool) -> None:
        slot = self.ptr[rows]
        self.observations[slot, rows] = obs
        self.actions[slot, rows] = actions
        self.rewards[slot, rows] = rewards
        self.discounts[slot, rows] = discounts
        self.last[slot, rows] = last
        self.ptr[rows] = (slot + 1) % self.capacity
        self.count[rows] = np.minimum(self.count[rows] + 1, self.capacity)

    def sample(self, batch_size: int, n: int = 1) -> NStepBatch:
        """Uniform over slots that start a transition and already have a successor; n-step returns stop
        early at an episode's final observation or at the newest slot of the row."""
        starts = np.maximum(self.count - 1, 0)  # the newest slot of a row has no successor yet
        if starts.sum() == 0:
            raise ValueError("the replay buffer holds no transition yet (every row needs two slots)")
        rows, pos = np.empty(batch_size, np.int64), np.empty(batch_size, np.int64)
        todo = np.arange(batch_size)
        for _ in range(1000):  # rejection of `last` slots, which are a small share of any buffer
            r = self.rng.choice(self.num_rows, size=todo.size, p=starts / starts.sum())
            p = (self.rng.random(todo.size) * starts[r]).astype(np.int64)
            ok = ~self.last[self._slot(r, p), r]
            rows[todo[ok]], pos[todo[ok]] = r[ok], p[ok]
            todo = todo[~ok]
            if todo.size == 0:
                break
        else:
            raise ValueError("the replay buffer holds no slot that starts a transition")
        slot = self._slot(rows, pos)
        returns, discount = np.zeros(batch_size, np.float64), np.ones(batch_size, np.float64)
        steps, going = np.zeros(batch_size, np.int64), np.ones(batch_size, bool)
        for k in range(n):
            s = self._slot(rows, pos + k)
            returns += np.where(going, discount * self.rewards[s, rows], 0.0)
            discount = np.where(going, discount * self.discounts[s, rows], discount)
            steps += going
            # Stop when the successor is an episode's final observation or the newest slot of the row.
            nxt = pos + k + 1
            going &= (nxt < self.count[rows] - 1) & ~self.last[self._slot(rows, nxt), rows]
        nxt_slot = self._slot(rows, pos + steps)
        return NStepBatch(self.observations[slot, rows], self.actions[slot, rows], returns.astype(np.float32),
                          discount.astype(np.float32), self.observations[nxt_slot, rows], steps, rows)

    def _slot(self, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Logical position (0 = oldest held slot of the row) -> physical slot."""
        return (self.ptr[rows] - self.count[rows] + pos) % self.capacity
