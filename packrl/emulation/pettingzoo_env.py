"""PettingZoo Parallel and AEC envs as packed rows: one row per possible agent.

Row ``i`` belongs to ``possible_agents[i]`` for the whole life of the env. Agents with equal
spaces share one layout pair (a Group, see ``env.emulated``); rows are ``env.emulated.nbytes``
wide and a group narrower than that fills the prefix ``row[:group.observation.nbytes]`` (the
rest stays zero). ``env.emulated.rows_for(observations, group)`` cuts one group's rows to its
width for ``nativize``. One group whose observation space is a Box passes through: rows are the
Box itself, as for single-agent envs.

How a learner reads the buffers (both kinds):

- ``masks[i]`` is true when row ``i`` holds an observation to act on: agent ``i`` is alive
  (Parallel) or is the one to act (AEC). Only those rows' actions are read by the next ``step``;
  a batched policy writes something in every row and the others are not looked at. Actions
  given as a mapping ``{agent: action}`` are checked strictly instead: an agent that is not
  alive or not acting is an error.
- Masked rows hold zeros; drop them. The reward and end flags of an action taken at a step
  where ``masks[i]`` was true arrive on row ``i`` at the next step where ``masks[i]``,
  ``terminals[i]`` or ``truncations[i]`` is true (Parallel: the very next step; AEC: the
  agent's next turn). Rewards an agent receives in between are added up and delivered there,
  never lost; a row's reward is zero on every other step.
- An agent's termination or truncation is reported once, on the step it happens, with its last
  reward; its last observation is written to ``final_observations[i]`` and its row in
  ``observations`` becomes zeros (the agent is gone). An agent that appears later (a spawn)
  simply gets its row unmasked.
- ``done`` is true after the step that ended the whole episode (no agent left to act); rewards
  still pending then are delivered on that step. Emulated envs do not reset themselves
  (``autoreset = False``): call ``reset`` (vector backends do it in the same step).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from packrl.emulation.emulated import Emulated, group_agents
from packrl.emulation.rows import EmulatedRows
from packrl.emulation.step_checks import (
    F32_MAX,
    checked_flag,
    checked_info,
    checked_parallel_step,
    checked_reset,
    checked_reward,
    checked_step,
    env_name,
)
from packrl.emulation.values import short
from packrl.errors import EmulationError, ObservationError


class _AgentRows(EmulatedRows):
    """What the Parallel and AEC emulations share on top of ``EmulatedRows``: agents by row,
    reward and flag checks, action decoding."""

    def __init__(self, env: Any, round_floats: bool = False, action_mask_key: str | None = "action_mask",
                 finite_rewards: bool = True):
        self.possible_agents = tuple(env.possible_agents)
        if len(set(self.possible_agents)) != len(self.possible_agents):
            raise EmulationError(f"possible_agents has repeated names: {list(self.possible_agents)}")
        if not self.possible_agents:
            raise EmulationError("the env has no possible_agents: nothing to give rows to")
        self._row = {agent: i for i, agent in enumerate(self.possible_agents)}
        emulated: Emulated = group_agents(
            self.possible_agents,
            {a: env.observation_space(a) for a in self.possible_agents},
            {a: env.action_space(a) for a in self.possible_agents},
            round_floats=round_floats, action_mask_key=action_mask_key)
        self._pending = [0.0] * len(self.possible_agents)  # rewards not yet delivered, per row
        super().__init__(env, emulated, _shared_action_space(emulated), finite_rewards)

    def _reward(self, agent: Any, reward: Any) -> float:
        """One agent's reward, checked (``packrl.emulation.step_checks``)."""
        if (type(reward) is not float and type(reward) is not int) or not -F32_MAX <= reward <= F32_MAX:
            reward = checked_reward(reward, self.env, self.finite_rewards, who=f", agent {agent!r}")
        return reward

    def _flags(self, agent: Any, terminated: Any, truncated: Any) -> tuple[bool, bool]:
        """One agent's end flags, checked."""
        if terminated is not False and terminated is not True:
            terminated = checked_flag(terminated, "terminated", self.env, who=f", agent {agent!r}")
        if truncated is not False and truncated is not True:
            truncated = checked_flag(truncated, "truncated", self.env, who=f", agent {agent!r}")
        return terminated, truncated

    def _write(self, writers: list, row: int, obs: Any) -> None:
        try:
            writers[row].pack(obs)
        except EmulationError as err:
            raise ObservationError(f"agent {self.possible_agents[row]!r}: observation does not fit its space: {err}") from None

    def _clear(self) -> None:
        self.observations[...] = 0
        self.rewards[:] = 0.0
        self.terminals[:] = False
        self.truncations[:] = False
        self.masks[:] = False
        self._pending = [0.0] * self.num_agents

    # ------------------------------------------------------------ agents and actions

    def row_of_reported(self, agent: Any) -> int:
        """The row of an agent the env reported; EmulationError if it is not a possible agent."""
        try:
            return self._row[agent]
        except (KeyError, TypeError):
            raise EmulationError(f"the env reported agent {agent!r}, which is not in possible_agents "
                                 f"{list(self.possible_agents)}") from None

    def _decode(self, row: int, action: Any) -> Any:
        """One row's policy-facing action -> the agent's native action (range checked)."""
        return self._row_groups[row].action.decode(action, who=f" for agent {self.possible_agents[row]!r}")

    def _row_actions(self, actions: Any, rows: list[int]) -> dict:
        """{agent: native action} for ``rows``, from a batch with a leading num_agents axis or from
        a mapping {agent: action} that must name exactly the agents of ``rows``."""
        if isinstance(actions, Mapping) and not _is_hybrid_batch(actions, self._row_groups):
            wanted = {self.possible_agents[r] for r in rows}
            for agent in actions:
                if agent not in wanted:
                    why = self._why_not_acting(agent) if agent in self._row else \
                        f"not in possible_agents {list(self.possible_agents)}"
                    raise EmulationError(f"action given for agent {agent!r}, which is {why}")
            missing = [self.possible_agents[r] for r in rows if self.possible_agents[r] not in actions]
            if missing:
                raise EmulationError(f"no action given for agent(s) {missing}, which must act this step")
            return {self.possible_agents[r]: self._decode(r, actions[self.possible_agents[r]]) for r in rows}
        if isinstance(actions, Mapping):  # hybrid batch {"discrete": (rows, k), "continuous": (rows, m)}
            for part, value in actions.items():
                _check_length(value, self.num_agents, f"hybrid actions[{part!r}]")
            return {self.possible_agents[r]: self._decode(r, {k: v[r] for k, v in actions.items()}) for r in rows}
        _check_length(actions, self.num_agents, "actions")
        return {self.possible_agents[r]: self._decode(r, actions[r]) for r in rows}

    def _why_not_acting(self, agent: Any) -> str:
        """Why a possible agent may not be given an action now (each emulation says it its way)."""
        return "not acting this step"

    @property
    def agents(self) -> list:
        """The env's current agents (PettingZoo's ``env.agents``)."""
        return list(self.env.agents)


class ParallelEmulation(_AgentRows):
    """A PettingZoo ParallelEnv: every alive agent acts each step (module docstring: the rows)."""

    def __init__(self, env: Any, round_floats: bool = False, action_mask_key: str | None = "action_mask",
                 finite_rewards: bool = True):
        super().__init__(env, round_floats, action_mask_key, finite_rewards)
        self._alive: list[int] = []  # rows of the agents that act next step
        self._ended = [True] * self.num_agents  # per row: the agent ended (or has not appeared yet)
        self._done = True
        self._warned_infos = False

    @property
    def done(self) -> bool:
        """True after the step that ended the episode (no agent alive and none left to appear)."""
        return self._done

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, infos = checked_reset(self.env.reset(seed=seed, options=options), self.env, parallel=True)
        if not isinstance(obs, dict):
            raise EmulationError(f"{env_name(self.env)}: reset() returned observations={short(obs, 80)} "
                                 f"({type(obs).__name__}); a Parallel env returns a dict keyed by agent")
        self._clear()
        self._ended = [True] * self.num_agents
        for agent, value in obs.items():
            row = self.row_of_reported(agent)
            self._write(self._obs_rows, row, value)
            self.masks[row] = True
            self._ended[row] = False
        self._alive = [int(r) for r in np.flatnonzero(self.masks)]
        self._done = not self._alive and self._none_to_come()
        return self.observations, infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._done:
            raise EmulationError("the episode is over (no agent alive): call reset() before step()")
        native = self._row_actions(actions, self._alive)
        live = [self.possible_agents[row] for row in self._alive]
        obs, rewards, terminations, truncations, infos = checked_parallel_step(
            self.env.step(native), self.env, live)
        self._record(obs, rewards, terminations, truncations)
        return self.observations, self.rewards, self.terminals, self.truncations, self._all_infos(infos, live)

    def _all_infos(self, infos: dict, live: list) -> dict:
        """``infos`` with ``{}`` for each agent that acted and has no entry (multigrid returns an empty
        ``defaultdict(dict)``; PettingZoo's own API test only warns): nothing is lost, so one warning per env."""
        missing = [agent for agent in live if agent not in infos]
        if not missing:
            return infos
        if not self._warned_infos:
            self._warned_infos = True
            warnings.warn(f"packrl: {env_name(self.env)}: step() returned infos without agent {missing[0]!r}"
                          + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")
                          + ", which was alive and acted; a missing info reads as {} (warned once per env)",
                          RuntimeWarning, stacklevel=3)
        return {**infos, **{agent: {} for agent in missing}}

    def _record(self, obs: dict, rewards: dict, terminations: dict, truncations: dict) -> None:
        """Write one step's outputs into the rows. Plain Python per reported agent: with the few to
        few hundred agents of PettingZoo envs this beats whole-array numpy passes."""
        masks, terminals, truncs, ended = self.masks, self.terminals, self.truncations, self._ended
        masks[:] = False  # full clears: a vector backend may have restored flags after a reset
        terminals[:] = False
        truncs[:] = False
        self.rewards[:] = 0.0
        pending, row_of = self._pending, self._row
        for agent, reward in rewards.items():
            pending[row_of[agent] if agent in row_of else self.row_of_reported(agent)] += self._reward(agent, reward)
        for flags in (terminations, truncations):
            if not flags.keys() <= row_of.keys():
                self.row_of_reported(next(a for a in flags if a not in row_of))
        alive, delivered = [], []
        for agent, value in obs.items():
            row = row_of[agent] if agent in row_of else self.row_of_reported(agent)
            terminated, truncated = self._flags(agent, terminations.get(agent, False), truncations.get(agent, False))
            if terminated or truncated:
                self._write(self._final_rows, row, value)
                terminals[row], truncs[row] = terminated, truncated
                ended[row] = True
            else:
                self._write(self._obs_rows, row, value)
                masks[row] = True
                ended[row] = False
                alive.append(row)
            delivered.append(row)
        for row in self._alive:
            if not masks[row]:
                if not (terminals[row] or truncs[row]):
                    self._refuse_disappearance(row, terminations, truncations)
                self.observations[row] = 0  # a gone agent's row holds zeros, not stale data
        self._alive = alive
        self._done = not alive and self._none_to_come()
        for row in range(self.num_agents) if self._done else delivered:
            if pending[row]:
                self.rewards[row] = pending[row]
                pending[row] = 0.0

    def _refuse_disappearance(self, row: int, terminations: dict, truncations: dict) -> None:
        """An agent alive before the step came back with no observation (and no final one)."""
        agent = self.possible_agents[row]
        if terminations.get(agent, False) or truncations.get(agent, False):
            raise EmulationError(f"the env ended agent {agent!r} without its final observation "
                                 "(PettingZoo's parallel API returns it in the step's observations)")
        raise EmulationError(f"agent {agent!r} was alive but the env returned neither an observation nor a "
                             "termination or truncation for it")

    def _none_to_come(self) -> bool:
        """No agent of env.agents is still waiting to appear."""
        return all(self._ended[self.row_of_reported(a)] for a in self.env.agents)

    def _why_not_acting(self, agent: Any) -> str:
        return "not alive" if self._ended[self._row[agent]] else "not acting this step"


class AECEmulation(_AgentRows):
    """A PettingZoo AECEnv played natively, one turn per ``step``: only the acting agent's row is
    unmasked, and its action is the one read. Agents that ended are stepped with ``None``
    internally (PettingZoo's dead-agent steps) and report their end, final reward and final
    observation on the step the game reaches them. Each agent's reward is what PettingZoo's
    ``last()`` gives it on its turn: everything it received since its previous action."""

    def __init__(self, env: Any, round_floats: bool = False, action_mask_key: str | None = "action_mask",
                 finite_rewards: bool = True):
        super().__init__(env, round_floats, action_mask_key, finite_rewards)
        self._acting: int | None = None

    @property
    def done(self) -> bool:
        """True after the step that ended the game (no agent left in env.agents)."""
        return self._acting is None

    @property
    def acting_agent(self) -> Any:
        """The agent whose row is unmasked (None once the game is over)."""
        return None if self._acting is None else self.possible_agents[self._acting]

    @property
    def acting_row(self) -> int | None:
        """The row of the acting agent (None once the game is over)."""
        return self._acting

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        self.env.reset(seed=seed, options=options)
        # found after each reset: a wrapper may store these attributes itself once reset
        self._agents_holder = _holder(self.env, "agents")
        self._selection_holder = _holder(self.env, "agent_selection")
        self._clear()
        self._acting = None
        infos = self._advance()
        return self.observations, infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        row = self._acting
        if row is None:
            raise EmulationError("the game is over (no agent left to act): call reset() before step()")
        if isinstance(actions, np.ndarray) and actions.ndim and actions.shape[0] == self.num_agents:
            native = self._decode(row, actions[row])  # the usual batch: read the acting row only
        else:
            native = self._row_actions(actions, [row])[self.possible_agents[row]]
        self.env.step(native)
        self.rewards[:] = 0.0
        self.terminals[:] = False
        self.truncations[:] = False
        self.masks[row] = False
        self.observations[row] = 0
        infos = self._advance()
        return self.observations, self.rewards, self.terminals, self.truncations, infos

    def _advance(self) -> dict:
        """Run the dead-agent turns until an agent must act (its row unmasked) or the game is over."""
        env, infos = self.env, {}
        agents, selection = self._agents_holder, self._selection_holder
        self._acting = None
        while agents.agents:
            agent = selection.agent_selection
            row = self.row_of_reported(agent)
            last = env.last()
            if type(last) is not tuple or len(last) != 5:
                last = checked_step(last, env, parallel=False)
            obs, reward, terminated, truncated, info = last
            if not isinstance(info, dict):
                checked_info(info, env, "last()", who=f" (agent {agent!r})")
            terminated, truncated = self._flags(agent, terminated, truncated)
            self.rewards[row] += self._reward(agent, reward)
            infos[agent] = info
            if terminated or truncated:
                self._write(self._final_rows, row, obs)
                self.terminals[row] |= terminated
                self.truncations[row] |= truncated
                env.step(None)
                continue
            self._write(self._obs_rows, row, obs)
            self.masks[row] = True
            self._acting = row
            break
        return infos

    def _why_not_acting(self, agent: Any) -> str:
        return f"not the acting agent (that is {self.acting_agent!r})"


# ---------------------------------------------------------------- helpers

def _holder(env: Any, name: str) -> Any:
    """The object that holds attribute ``name``. PettingZoo's AEC wrappers forward attributes they
    lack through ``__getattr__`` at every read (microseconds per wrapper, per turn); the holder
    is read directly instead. Only wrappers that neither store nor define ``name`` are skipped."""
    try:
        from pettingzoo.utils.wrappers import BaseWrapper
    except ImportError:  # pragma: no cover - pettingzoo is a dependency
        return env
    while (isinstance(env, BaseWrapper) and name not in vars(env)
           and not any(name in vars(cls) for cls in type(env).__mro__)):
        env = env.env
    return env


def _shared_action_space(emulated: Emulated) -> spaces.Space:
    """One action space for all rows. Equal groups share theirs; Discrete groups of different sizes
    get Discrete(largest n) and MultiDiscrete groups with the same number of branches get the
    largest choice count per branch: every agent can receive every one of its own actions, and a
    choice beyond an agent's own range is refused naming the agent (``emulated.action_for(agent)``
    gives each row's exact space, for per-group heads). Other mixes keep the first group's space
    and take actions as a list with one policy-facing action per row."""
    policy = [g.action.policy_space for g in emulated.groups]
    if all(p == policy[0] for p in policy):
        return policy[0]
    kinds = {g.action.kind for g in emulated.groups}
    if kinds == {"discrete"}:
        return spaces.Discrete(max(int(g.action.nvec[0]) for g in emulated.groups))
    if kinds == {"multidiscrete"} and len({g.action.num_discrete for g in emulated.groups}) == 1:
        return spaces.MultiDiscrete(np.max([g.action.nvec for g in emulated.groups], axis=0))
    return policy[0]


def _is_hybrid_batch(actions: Mapping, groups: tuple) -> bool:
    return set(actions) == {"discrete", "continuous"} and any(g.action.kind == "hybrid" for g in groups)


def _check_length(actions: Any, num_agents: int, what: str) -> None:
    try:
        length = len(actions)
    except TypeError:
        raise EmulationError(f"{what} must have a leading axis of {num_agents} rows (one per possible agent), "
                             f"got {type(actions).__name__}") from None
    if length != num_agents:
        shape = getattr(actions, "shape", (length,))
        raise EmulationError(f"{what} has {length} rows (shape {tuple(shape)}), expected {num_agents}: "
                             "one per possible agent")
