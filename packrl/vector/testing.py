"""Small gymnasium envs for checking and timing vectorizers.

``ScriptedEnv``: episodes of known length that end by termination or truncation in turn,
observations that say which env, episode and step they come from, and seeded noise, so a
test can predict every row. ``StructuredEnv``: a 12 KB Dict observation and a negligible
(or fixed busy) step, the benchmark's structured env.
"""
from __future__ import annotations

import time
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces


class ScriptedEnv(gymnasium.Env):
    """Episode e of a run lasts ``3 + (seed + e) % 4`` steps; even episodes terminate, odd
    ones truncate. Reward = step + action / 10. ``fail_at``: raise on that step count."""

    def __init__(self, fail_at: int | None = None):
        self.observation_space = spaces.Dict({
            "seed": spaces.Box(-2**62, 2**62, (), np.int64),
            "episode": spaces.Box(0, 2**31 - 1, (), np.int32),
            "t": spaces.Discrete(16),
            "last_action": spaces.Discrete(3),
            "noise": spaces.Box(0.0, 1.0, (2,), np.float64),
        })
        self.action_space = spaces.Discrete(3)
        self.fail_at = fail_at
        self.base, self.episode, self.t, self.steps = -1, -1, 0, 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.base, self.episode = seed, -1
        self.episode += 1
        self.t = 0
        self.length = 3 + (self.base + self.episode) % 4
        return self._obs(0), {"episode": self.episode} if self.episode % 3 == 2 else {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        self.steps += 1
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise RuntimeError(f"scripted failure at step {self.steps}")
        self.t += 1
        ended = self.t >= self.length
        terminated, truncated = ended and self.episode % 2 == 0, ended and self.episode % 2 == 1
        return self._obs(int(action)), self.t + int(action) / 10, terminated, truncated, {}

    def _obs(self, action: int) -> dict:
        return {"seed": np.int64(self.base), "episode": np.int32(self.episode), "t": self.t,
                "last_action": action, "noise": self.np_random.random(2)}


class StructuredEnv(gymnasium.Env):
    """A 12 KB Dict observation (image, vector, inventory, mode); episodes of 200 steps
    (truncated). ``busy_us``: spin that long in every step, as a stand-in for env work."""

    def __init__(self, busy_us: float = 0.0):
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (64, 64, 3), np.uint8),
            "position": spaces.Box(-1.0, 1.0, (3,), np.float32),
            "inventory": spaces.MultiDiscrete([5] * 8),
            "mode": spaces.Discrete(4),
        })
        self.action_space = spaces.Discrete(4)
        self.busy_s = busy_us * 1e-6
        self.t = 0
        self.obs = {"image": np.zeros((64, 64, 3), np.uint8), "position": np.zeros(3, np.float32),
                    "inventory": np.zeros(8, np.int64), "mode": 0}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.obs, {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self.busy_s:
            end = time.perf_counter() + self.busy_s
            while time.perf_counter() < end:
                pass
        self.t += 1
        self.obs["mode"] = int(action)
        return self.obs, 1.0, False, self.t >= 200, {}


class SeededFailure(ScriptedEnv):
    """Env 3 of a vector env (seeded 3 on the first reset) raises on its third step."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed == 3:
            self.fail_at = 3
        return super().reset(seed=seed, options=options)


class HangingEnv(ScriptedEnv):
    """The env seeded ``hang_seed`` on its first reset blocks in ``step`` (sleeps ``hang_s``): a
    stand-in for an env that hangs, for step timeouts and for a main process killed meanwhile."""

    hang_seed = 1
    hang_s = 3600.0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self.hangs = seed == self.hang_seed
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if getattr(self, "hangs", False):
            time.sleep(self.hang_s)
        return super().step(action)


class CloseFails(ScriptedEnv):
    """The envs seeded 1 and 3 on their first reset raise OSError from ``close``."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self.seed_ = seed
        return super().reset(seed=seed, options=options)

    def close(self) -> None:
        if getattr(self, "seed_", None) in (1, 3):
            raise OSError(f"close of env {self.seed_} failed")
