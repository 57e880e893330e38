"""An emulated multi-agent env as a PettingZoo env: ``as_pettingzoo(emulate(parallel_env))``.

The result is a PettingZoo ``ParallelEnv`` (``api="parallel"``, the default) or ``AECEnv``
(``api="aec"``: PettingZoo's own ``parallel_to_aec`` over the Parallel form), so PettingZoo tooling
(its API tests, SuperSuit's wrappers and vector recipes, ``parallel_to_aec``) applies after packrl.

- Observations are each agent's packed row, a copy: ``observation_space(agent)`` is the emulated env's
  ``single_observation_space`` for every agent (a uint8 Box of the row's width, or the env's own Box
  where its observation already was one). Agents whose native spaces differ share this one row space
  (a narrower agent's row is zero past its layout's width), and ``env.emulated.observation_for(agent)``
  unpacks it.
- Actions are the policy-facing ones (``action_space(agent)`` is the agent's
  ``ActionLayout.policy_space``: Discrete from 0, MultiDiscrete, Box, or the hybrid
  ``Dict(discrete=, continuous=)``), as ``as_gymnasium`` offers them; the emulation decodes them
  into the agent's native action, range checked.
- A step returns, for every agent alive before it, its observation (the final one where it ended),
  reward, flags and info; an agent that appears gets its first observation; ``agents`` are the rows
  that are alive afterwards, in ``possible_agents`` order. Rewards an agent receives after its end
  (the emulation delivers them when the episode ends, never loses them) come under its name on
  that step.
- Infos are the env's own, one per agent (PettingZoo's form).

Turn-based AEC envs (``emulate(aec_env)``) are refused: their rows hold only the acting agent.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.conversions import parallel_to_aec
from pettingzoo.utils.env import ParallelEnv

from packrl.emulation.pettingzoo_env import AECEmulation, ParallelEmulation
from packrl.emulation.values import short
from packrl.errors import UsageError

APIS = ("parallel", "aec")


def as_pettingzoo(env: Any, api: str = "parallel") -> Any:
    """``env`` (``emulate(parallel_env)`` or ``emulate(gym_env, agents="tuple")``) as a PettingZoo
    ``ParallelEnv`` (``api="parallel"``) or ``AECEnv`` (``api="aec"``)."""
    if api not in APIS:
        raise UsageError(f"api={api!r}: choose 'parallel' or 'aec'")
    parallel = PackedParallelEnv(env)
    if api == "parallel":
        return parallel
    return parallel_to_aec(parallel)


class PackedParallelEnv(ParallelEnv):
    """PettingZoo's ``ParallelEnv`` over a ``ParallelEmulation`` (see the module docstring)."""

    def __init__(self, env: Any):
        _check_emulated(env)
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.agents: list = []
        self._row = {agent: row for row, agent in enumerate(self.possible_agents)}
        # one object per agent, returned as it is on every call (PettingZoo seeds spaces through them)
        self._observation_spaces = {agent: env.single_observation_space for agent in self.possible_agents}
        self._action_spaces = {agent: env.emulated.action_for_row(row).policy_space
                               for row, agent in enumerate(self.possible_agents)}
        inner = getattr(env.env, "metadata", None) or {}
        self.metadata = {**inner, "name": f"packrl_{inner.get('name', type(env.env).__name__)}",
                         "is_parallelizable": True}
        self.render_mode = getattr(env.env, "render_mode", None)

    def observation_space(self, agent: Any) -> spaces.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: Any) -> spaces.Space:
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        rows, infos = self.env.reset(seed=seed, options=options)
        alive = np.flatnonzero(self.env.masks).tolist()
        self.agents = [self.possible_agents[row] for row in alive]
        return ({self.possible_agents[row]: rows[row].copy() for row in alive},
                {agent: _info(infos, agent) for agent in self.agents})

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        if not isinstance(actions, Mapping):  # the emulation also takes a row batch; a ParallelEnv takes a dict
            raise UsageError(f"{self}.step: actions={short(actions, 60)} ({type(actions).__name__}); a PettingZoo "
                             f"ParallelEnv takes a dict {{agent: action}} for the agents {self.agents}")
        before = self.agents
        rows, rewards, terminals, truncations, infos = self.env.step(actions)
        final = self.env.final_observations
        obs, rew, term, trunc, info = {}, {}, {}, {}, {}
        for agent in before:
            row = self._row[agent]
            ended = bool(terminals[row] or truncations[row])
            obs[agent] = (final[row] if ended else rows[row]).copy()
            rew[agent] = float(rewards[row])
            term[agent], trunc[agent] = bool(terminals[row]), bool(truncations[row])
            info[agent] = _info(infos, agent)
        alive = np.flatnonzero(self.env.masks).tolist()
        self.agents = [self.possible_agents[row] for row in alive]
        for agent in self.agents:
            if agent not in obs:  # an agent that appeared at this step
                obs[agent] = rows[self._row[agent]].copy()
        for row in np.flatnonzero(rewards).tolist():  # rewards delivered to agents that had ended
            rew.setdefault(self.possible_agents[row], float(rewards[row]))
        return obs, rew, term, trunc, info

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def __str__(self) -> str:
        return self.metadata["name"]


def _info(infos: Any, agent: Any) -> dict:
    """One agent's info: its entry of the env's infos (a copy), or an empty dict."""
    entry = infos.get(agent) if isinstance(infos, dict) else None
    return dict(entry) if isinstance(entry, dict) else {}


def _check_emulated(env: Any) -> None:
    if isinstance(env, ParallelEmulation):
        return
    what = f"{type(env).__module__}.{type(env).__name__}"
    if isinstance(env, AECEmulation):
        raise UsageError(f"as_pettingzoo: {what} is a turn-based AEC env, whose rows hold only the acting agent; "
                         "emulate its parallel_env() form (or pettingzoo's aec_to_parallel of it) instead")
    if hasattr(env, "emulated") and hasattr(env, "num_envs"):
        raise UsageError(f"as_pettingzoo takes one emulated env (emulate(parallel_env)), not a vector env ({what})")
    if hasattr(env, "emulated"):
        raise UsageError(f"as_pettingzoo: {what} is a single-agent env; use packrl.compat.gymnasium.as_gymnasium")
    raise UsageError(f"as_pettingzoo takes emulate(parallel_env) or emulate(env, agents='tuple'); got {what}")
