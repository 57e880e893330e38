"""A gymnasium.Env that holds several agents, seen as a PettingZoo ParallelEnv (``emulate(env, agents="tuple")``).

Envs such as lbforaging and rware keep one agent per entry of a top-level Tuple observation and
action space, and return a list of per-agent rewards with one shared end flag (or per-agent flag
lists). ``TupleAgents`` presents such an env as a ParallelEnv with agents ``agent_0 .. agent_{n-1}``
(entry i of each Tuple), so ``ParallelEmulation`` gives it one row per agent, masks and per-agent
rewards, with the rows' usual rules (``packrl.emulation.pettingzoo_env``).

- A shared flag ends every agent; per-agent flags end each agent on the step its flag is first
  set (its end reported once, its row masked from then on). The env's Tuple action still needs
  an entry for an agent that ended before the others: it gets the last action it was given
  (ma-gym-style envs ignore the actions of agents that are done). The env's observation and
  reward of such an agent are not rows of its episode any more: its observation is dropped,
  its rewards are kept and delivered when the episode ends (never lost).
- Infos are keyed by agent, as PettingZoo's API has them: each agent alive before the step gets
  its own copy of the env's one info dict.
"""
from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from packrl.emulation.step_checks import checked_flag, checked_info, checked_reset, checked_step, env_name
from packrl.errors import EmulationError


class TupleAgents:
    """The ParallelEnv face of a gymnasium.Env whose Tuple spaces hold one entry per agent."""

    metadata: dict = {}

    def __init__(self, env: gymnasium.Env):
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, spaces.Tuple) or not isinstance(act_space, spaces.Tuple):
            raise EmulationError(f"{env_name(env)}: agents='tuple' needs a top-level Tuple observation and action space "
                                 f"(one entry per agent), got {obs_space} and {act_space}")
        if len(obs_space.spaces) != len(act_space.spaces) or not obs_space.spaces:
            raise EmulationError(f"{env_name(env)}: agents='tuple' needs as many observation as action entries (one "
                                 f"per agent, at least one), got {len(obs_space.spaces)} and {len(act_space.spaces)}")
        self.env = env
        self.num_entries = len(obs_space.spaces)
        self.possible_agents = [f"agent_{i}" for i in range(self.num_entries)]
        self._observation_spaces = dict(zip(self.possible_agents, obs_space.spaces))
        self._action_spaces = dict(zip(self.possible_agents, act_space.spaces))
        self._entry = {agent: i for i, agent in enumerate(self.possible_agents)}
        self.agents: list = []
        self._last_action: list = [None] * self.num_entries

    def observation_space(self, agent: Any) -> spaces.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: Any) -> spaces.Space:
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, info = checked_reset(self.env.reset(seed=seed, options=options), self.env)
        self.agents = list(self.possible_agents)
        self._last_action = [None] * self.num_entries
        return dict(zip(self.possible_agents, self._entries(obs, "observation"))), self._per_agent(info, self.agents)

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        for i, agent in enumerate(self.possible_agents):
            if agent in actions:
                self._last_action[i] = actions[agent]
        result = self.env.step(tuple(self._last_action))
        if type(result) is not tuple or len(result) != 5:
            result = checked_step(result, self.env)
        obs, reward, terminated, truncated, info = result
        obs = self._entries(obs, "observation")
        rewards = dict(zip(self.possible_agents, self._entries(reward, "reward")))
        terminations = dict(zip(self.possible_agents, self._flags(terminated, "terminated")))
        truncations = dict(zip(self.possible_agents, self._flags(truncated, "truncated")))
        alive = self.agents
        self.agents = [a for a in alive if not (terminations[a] or truncations[a])]
        # the agents alive before this step: their observation (a final one where they ended) and flags
        return ({a: obs[self._entry[a]] for a in alive}, rewards,
                {a: terminations[a] for a in alive}, {a: truncations[a] for a in alive}, self._per_agent(info, alive))

    def _per_agent(self, info: Any, agents: list) -> dict:
        """The env's one info as PettingZoo infos: a copy per agent (a consumer may write into one)."""
        if not isinstance(info, dict):
            checked_info(info, self.env)
        return {agent: dict(info) for agent in agents}

    def _entries(self, value: Any, field: str) -> list:
        """One entry per agent of a per-agent sequence, or EmulationError naming the field."""
        if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
            if len(value) == self.num_entries:
                return list(value)
        raise EmulationError(f"{env_name(self.env)} (agents='tuple'): step returned {field}={value!r}; expected a "
                             f"list or tuple of {self.num_entries} entries, one per agent")

    def _flags(self, value: Any, field: str) -> list:
        """Per-agent flags from one shared bool or a list of them (each checked where it is stored)."""
        if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
            return self._entries(value, field)
        return [checked_flag(value, field, self.env)] * self.num_entries

    # ------------------------------------------------------------ plumbing

    @property
    def spec(self) -> Any:
        return self.env.spec

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
