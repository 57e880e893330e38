"""A ``gymnasium.Env`` view of a single-agent ``emulate(env)``: ``as_gymnasium(env)``.

``emulate`` returns packrl's env protocol (buffers with one row per agent, policy-facing actions),
which is not a ``gymnasium.Env``. The view is one: its ``observation_space`` is the packed form
(a uint8 Box of ``layout.nbytes``, or the original Box when the observation already was one), its
``action_space`` the policy-facing one (``emulated.action.policy_space``: Discrete, MultiDiscrete,
Box, or the hybrid ``Dict(discrete=..., continuous=...)``), so anything written against gymnasium
(``check_env``, wrappers, SB3) runs on the packed env. ``reset``/``step`` return copies of the row
(the buffer is rewritten by the next step) and plain Python rewards and flags. A PettingZoo env
(several rows) has no ``gymnasium.Env`` form: use ``packrl.vector.make`` for it.
"""
from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from packrl.errors import UsageError


def as_gymnasium(env: Any) -> "EmulatedEnv":
    """``env`` (``emulate(gym_env)``, or a gymnasium.Env, emulated here) as a ``gymnasium.Env`` with
    the packed observation and the policy-facing action spaces."""
    if isinstance(env, gymnasium.Env) and not hasattr(env, "emulated"):
        from packrl.emulation import emulate

        env = emulate(env)
    return EmulatedEnv(env)


class EmulatedEnv(gymnasium.Env):
    """The gymnasium view of one emulated single-agent env (see the module docstring). ``emulated``
    is the wrapped env's layouts; ``layout.unpack(obs)`` gives the native observation back."""

    def __init__(self, env: Any):
        if not hasattr(env, "emulated") or not hasattr(env, "set_buffers"):
            raise UsageError(f"as_gymnasium takes emulate(env) or a gymnasium.Env; got {type(env).__module__}."
                             f"{type(env).__name__}")
        if getattr(env, "autoreset", False) or int(env.num_agents) != 1:
            raise UsageError(f"as_gymnasium: {type(env).__name__} has {env.num_agents} rows "
                             f"{'and resets itself ' if getattr(env, 'autoreset', False) else ''}(a PettingZoo or "
                             "batched env); a gymnasium.Env has one agent: step it with packrl.vector.make instead")
        self.env = env
        self.emulated = env.emulated
        self.layout = env.emulated.observation
        self.observation_space = env.single_observation_space
        self.action_space = env.single_action_space
        inner = getattr(env, "env", None)
        self.metadata = dict(getattr(inner, "metadata", {}) or {})
        self.render_mode = getattr(inner, "render_mode", None)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        obs, info = self.env.reset(seed=seed, options=options)
        return obs[0].copy(), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, rewards, terminals, truncations, info = self.env.step(action)
        return obs[0].copy(), float(rewards[0]), bool(terminals[0]), bool(truncations[0]), info

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
