"""Reward scaling for training: rewards divided by a running standard deviation of the discounted return, clipped.

The scheme of gymnasium's ``NormalizeReward`` (what CleanRL's ``ppo_continuous_action.py`` stacks) and SB3's
``VecNormalize(norm_reward=True)``: each row carries ``R = gamma * R + r`` (reset where its episode ends), the
running variance of R over every acting step is kept, and training sees ``clip(r / sqrt(var + eps), -10, 10)``.
Only the learner's rewards are scaled: episode returns, history and ``packrl eval`` stay in the env's own units.
The statistics advance once per rollout, over all of its steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np

from packrl.running_moments import merge_moments

CLIP = 10.0
EPS = 1e-8


@dataclass
class RewardScaler:
    """Running statistics of the discounted return of ``num_rows`` rows (see the module doc)."""

    num_rows: int
    gamma: float
    returns: np.ndarray = field(init=False)
    mean: float = 0.0
    var: float = 1.0
    count: float = 0.0

    def __post_init__(self) -> None:
        self.returns = np.zeros(self.num_rows, np.float64)

    def update(self, rewards: np.ndarray, ended: np.ndarray, acted: np.ndarray) -> float:
        """Advance the rows' discounted returns over a rollout's ``(T, rows)`` rewards, ends and acting masks, merge
        the returns of the acting steps into the running variance, and give the factor rewards are scaled by."""
        values = np.empty(int(np.count_nonzero(acted)), np.float64)
        _discounted_returns(np.asarray(rewards, np.float64), np.asarray(ended, np.bool_), np.asarray(acted, np.bool_),
                            self.gamma, self.returns, values)
        if values.size:
            self.mean, self.var, self.count = merge_moments(self.mean, self.var, self.count, float(values.mean()),
                                                            float(values.var()), float(values.size))
        return self.factor

    @property
    def factor(self) -> float:
        return 1.0 / math.sqrt(self.var + EPS)

    def reset_returns(self) -> None:
        """New episodes in every row (envs reset): the carried returns start over, the statistics stay."""
        self.returns[:] = 0.0

    def state(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load(self, state: dict) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])
        if not (math.isfinite(self.var) and self.var >= 0 and self.count >= 0 and math.isfinite(self.mean)):
            raise ValueError(f"reward scaling statistics out of range: {state}")


@numba.njit(cache=True, nogil=True)
def _discounted_returns(rewards, ended, acted, gamma, returns, out) -> None:  # noqa: ANN001
    k = 0
    for t in range(rewards.shape[0]):
        for row in range(rewards.shape[1]):
            returns[row] = returns[row] * gamma + rewards[t, row]
            if acted[t, row]:
                out[k] = returns[row]
                k += 1
            if ended[t, row]:
                returns[row] = 0.0
