"""``make(..., backend="numba", halves=True)``: the copies of a Numba env as two batched envs of half each, which a
learner can step one at a time (``PPO`` with ``overlap=True``: while the policy runs for one half, the other half's
envs step). Both halves write into one set of whole arrays, so to everything else this is one vector env of
``num_envs`` copies, stepped and reset exactly as ``BatchedNumbaEnv`` of ``num_envs`` would be: copy j is seeded with
``seed + j`` either way, so the same actions give the same observations.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from packrl.envs.numba_env import BatchedNumbaEnv
from packrl.errors import UsageError
from packrl.vector.autoreset import SAME_STEP
from packrl.vector.numba_backend import make_numba


class NumbaHalves:
    """``num_envs`` (even) copies of a Numba env as ``halves[0]`` (rows ``rows[0]``) and ``halves[1]`` (rows
    ``rows[1]``), two ``BatchedNumbaEnv`` writing into row slices of this env's arrays. ``step`` and ``reset``
    act on both; ``halves[h].step(actions[rows[h]])`` steps one half (its results are this env's arrays' rows)."""

    autoreset = True
    metadata = {"autoreset_mode": SAME_STEP}

    def __init__(self, env: Any, num_envs: int, seed: int = 0, **kwargs: Any):
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 2 or num_envs % 2:
            raise UsageError(f"halves=True needs an even num_envs >= 2 (two halves of equal size), got {num_envs!r}")
        n = int(num_envs) // 2
        self.whole = make_numba(env, 2 * n, seed=seed, threads=1)  # the metadata and arrays of all copies
        self.halves: tuple[BatchedNumbaEnv, BatchedNumbaEnv] = (make_numba(env, n, seed=seed, **kwargs),
                                                                make_numba(env, n, seed=seed + n, **kwargs))
        w = self.whole
        per = getattr(w, "agents_per_env", 1)  # rows per copy: a Numba env with agents has one per agent
        self.rows = (slice(0, n * per), slice(n * per, 2 * n * per))
        self._per = per
        for half, rows in zip(self.halves, self.rows):
            half.set_buffers(w.observations[rows], w.final_observations[rows], w.rewards[rows], w.terminals[rows],
                             w.truncations[rows], w.masks[rows])
        self.num_envs, self.num_agents = 2 * n, w.num_agents
        if per > 1:
            self.agents_per_env = per
        self.name, self.numba_env, self.emulated, self.passthrough = w.name, w.numba_env, w.emulated, w.passthrough
        self.possible_agents = self.agents = w.agents
        self.single_observation_space, self.single_action_space = w.single_observation_space, w.single_action_space
        self.observation_space, self.action_space = w.observation_space, w.action_space
        self.observations, self.final_observations, self.rewards = w.observations, w.final_observations, w.rewards
        self.terminals, self.truncations, self.masks = w.terminals, w.truncations, w.masks
        self.closed = False

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Reset both halves: ``seed`` seeds copy j with ``seed + j`` (None: as ``BatchedNumbaEnv.reset``)."""
        for half, rows in zip(self.halves, self.rows):
            half.reset(None if seed is None else int(seed) + rows.start // self._per, options)  # seed + copy index
        return self.observations, {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every copy (the first half, then the second)."""
        infos: dict = {}
        for half, rows in zip(self.halves, self.rows):
            part = half.step(_rows(actions, rows))[4]
            if part:  # episode infos: indices within the half, made whole
                infos = _merge_infos(infos, part, rows.start)
        return self.observations, self.rewards, self.terminals, self.truncations, infos

    def close(self) -> None:
        for env in (*self.halves, self.whole):
            env.close()
        self.closed = True

    def __repr__(self) -> str:
        return f"NumbaHalves({self.name!r}, num_envs={self.num_envs})"


def _rows(actions: Any, rows: slice) -> Any:
    return {k: v[rows] for k, v in actions.items()} if isinstance(actions, dict) else actions[rows]


def _merge_infos(infos: dict, part: dict, offset: int) -> dict:
    part = dict(part, episode_index=part["episode_index"] + offset)
    if not infos:
        return part
    return {k: np.concatenate([infos[k], part[k]]) for k in part}
