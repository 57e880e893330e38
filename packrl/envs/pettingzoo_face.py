"""One copy of any Numba env as a PettingZoo env: ``parallel_env("simple_spread")`` or ``aec_env("cartpole")``.

The copy is a one-copy batched env (``threads=1``) seen through PettingZoo's API with the env's own spaces: native
observations (the env's ``observation_space``, unpacked from the row, a copy) and native actions (checked against
``action_space``, then given to the kernel in its policy-facing form). A single-agent env has one agent,
``"agent_0"``. The batched env resets a copy whose agents all ended within the same step; this face hides that:
the step reports each ended agent's final observation, ``agents`` becomes empty, and ``reset`` starts the next
episode. ``aec_env`` of a turn-based env (``turns=True``) is :class:`NumbaAECEnv`, moving in the env's own order
(``agent_selection`` is the agent due to move); of any other env, PettingZoo's ``parallel_to_aec`` over the
Parallel form. A turn-based env has no Parallel form (as PettingZoo's classic games have none).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.conversions import parallel_to_aec
from pettingzoo.utils.env import AECEnv, ParallelEnv

from packrl.envs import batched, spec
from packrl.envs.numba_env import NumbaEnv
from packrl.errors import EmulationError, UsageError

SINGLE_AGENT = "agent_0"


class OneCopy:
    """One copy of a Numba env (a one-copy batched env, ``threads=1``) read and driven per agent: the rows of its
    agents, their native observations, the agents alive, and native actions encoded as the kernel's rows. Both
    PettingZoo faces hold one."""

    def __init__(self, spec: NumbaEnv, seed: int, **kwargs: Any):
        self.numba_env = spec
        self.batched = batched(spec, 1, seed=seed, threads=1, **kwargs)
        self.possible_agents = list(spec.agents) if spec.agents else [SINGLE_AGENT]
        self.row = {agent: row for row, agent in enumerate(self.possible_agents)}
        self.observation_spaces = {agent: spec.observation_space_of(agent) for agent in self.possible_agents}
        self.action_spaces = {agent: spec.action_space for agent in self.possible_agents}
        emulated = self.batched.emulated
        self.layouts = {agent: emulated.groups[emulated.row_group[row]].observation for agent, row in self.row.items()}
        self.action = emulated.action

    def native(self, agent: Any, row: np.ndarray) -> Any:
        """The native observation of ``agent`` in its row (a copy)."""
        if self.batched.passthrough:
            return row.copy()
        layout = self.layouts[agent]
        return layout.to_native(layout.unpack(row[: layout.nbytes]))

    def alive(self) -> list:
        """The agents whose rows are live, in row order."""
        return [self.possible_agents[row] for row in np.flatnonzero(self.batched.masks).tolist()]

    def policy_batch(self, actions: Mapping, name: str) -> Any:
        """The agents' native actions (checked against the space) as the kernel's policy-facing rows."""
        n = len(self.possible_agents)
        encoded = {}
        for agent, native in actions.items():
            if not self.action_spaces[agent].contains(native):
                raise EmulationError(f"{name}: action {native!r} of agent {agent!r} is outside its action space "
                                     f"{self.action_spaces[agent]}")
            encoded[self.row[agent]] = self.action.encode(native)
        if self.action.kind == "hybrid":
            disc = np.zeros((n, self.action.num_discrete), np.int64)
            cont = np.zeros((n, self.action.num_continuous), self.action.continuous_dtype)
            for row, value in encoded.items():
                disc[row], cont[row] = value["discrete"], value["continuous"]
            return {"discrete": disc, "continuous": cont}
        shape, dtype = self.batched.action_shapes[0]
        batch = np.zeros((n, *shape), dtype)
        for row, value in encoded.items():
            batch[row] = value
        return batch


class NumbaParallelEnv(ParallelEnv):
    """PettingZoo's ``ParallelEnv`` over one copy of a Numba env (see the module docstring)."""

    def __init__(self, env: Any, seed: int = 0, **kwargs: Any):
        spec = _spec(env)
        if spec.turns:
            raise UsageError(f"numba env {spec.name!r} moves in turns: it has no PettingZoo Parallel form; use "
                             "packrl.envs.pettingzoo_face.aec_env")
        self.copy = OneCopy(spec, seed, **kwargs)
        self.numba_env, self.batched = spec, self.copy.batched
        self.possible_agents = self.copy.possible_agents[:]
        self.agents: list = []
        self.metadata = {"name": f"packrl_numba_{spec.name}", "is_parallelizable": True, "render_modes": []}
        self.render_mode = None

    def observation_space(self, agent: Any) -> spaces.Space:
        return self.copy.observation_spaces[agent]

    def action_space(self, agent: Any) -> spaces.Space:
        return self.copy.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        rows, _ = self.batched.reset(seed=seed)
        self.agents = self.copy.alive()
        return {agent: self.copy.native(agent, rows[self.copy.row[agent]]) for agent in self.agents}, \
            {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        if not isinstance(actions, Mapping):
            raise UsageError(f"{self}.step: a PettingZoo ParallelEnv takes a dict {{agent: action}} for the agents "
                             f"{self.agents}, got {type(actions).__name__}")
        for agent in actions:
            if agent not in self.agents:
                raise EmulationError(f"{self}: action given for agent {agent!r}, which is not alive "
                                     f"(alive: {self.agents})")
        missing = [agent for agent in self.agents if agent not in actions]
        if missing:
            raise EmulationError(f"{self}: no action given for agent(s) {missing}, which must act this step")
        batch = self.copy.policy_batch(actions, str(self))
        before = self.agents
        rows, rewards, terminals, truncations, _ = self.batched.step(batch)
        final = self.batched.final_observations
        obs, rew, term, trunc = {}, {}, {}, {}
        for agent in before:
            row = self.copy.row[agent]
            ended = bool(terminals[row] or truncations[row])
            obs[agent] = self.copy.native(agent, final[row] if ended else rows[row])
            rew[agent] = float(rewards[row])
            term[agent], trunc[agent] = bool(terminals[row]), bool(truncations[row])
        over = all(term[a] or trunc[a] for a in before) if not self.numba_env.agents else self.batched.episode_steps[0] == 0
        self.agents = [] if over else self.copy.alive()
        for agent in self.agents:
            if agent not in obs:  # joined at this step
                obs[agent] = self.copy.native(agent, rows[self.copy.row[agent]])
        return obs, rew, term, trunc, {agent: {} for agent in before}

    def render(self) -> None:
        return None

    def close(self) -> None:
        self.batched.close()

    def __str__(self) -> str:
        return self.metadata["name"]


class NumbaAECEnv(AECEnv):
    """PettingZoo's ``AECEnv`` over one copy of a turn-based Numba env: ``agent_selection`` is the agent due to
    move. ``observe(agent)`` gives the agent's row as the batched env shows it: the mover's observation, zeros for
    an agent not to move, the final observation once the game ended."""

    def __init__(self, env: Any, seed: int = 0, **kwargs: Any):
        super().__init__()
        spec = _spec(env)
        self.copy = OneCopy(spec, seed, **kwargs)
        self.numba_env, self.batched = spec, self.copy.batched
        self.possible_agents = self.copy.possible_agents[:]
        self.agents: list = []
        self.metadata = {"name": f"packrl_numba_{spec.name}", "is_parallelizable": False, "render_modes": []}
        self.render_mode = None
        self._obs: dict = {}

    def observation_space(self, agent: Any) -> spaces.Space:
        return self.copy.observation_spaces[agent]

    def action_space(self, agent: Any) -> spaces.Space:
        return self.copy.action_spaces[agent]

    def observe(self, agent: Any) -> Any:
        return self._obs[agent]

    def _read(self, rows: np.ndarray) -> None:
        self._obs = {agent: self.copy.native(agent, rows[row]) for agent, row in self.copy.row.items()}

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        rows, _ = self.batched.reset(seed=seed)
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}
        self._read(rows)
        self.agent_selection = self.copy.alive()[0]

    def step(self, action: Any) -> None:
        mover = self.agent_selection
        if self.terminations[mover] or self.truncations[mover]:
            self._was_dead_step(action)
            return
        batch = self.copy.policy_batch({mover: action}, str(self))
        rows, rewards, terminals, truncations, _ = self.batched.step(batch)
        self._cumulative_rewards[mover] = 0.0
        self.rewards = {agent: float(rewards[row]) for agent, row in self.copy.row.items()}
        if terminals.any() or truncations.any():  # the game ended for every agent (and the copy was reset)
            self._read(self.batched.final_observations)
            for agent, row in self.copy.row.items():
                self.terminations[agent], self.truncations[agent] = bool(terminals[row]), bool(truncations[row])
            order = self.possible_agents
            self.agent_selection = order[(order.index(mover) + 1) % len(order)]
        else:
            self._read(rows)
            self.agent_selection = self.copy.alive()[0]
        self._accumulate_rewards()

    def render(self) -> None:
        return None

    def close(self) -> None:
        self.batched.close()

    def __str__(self) -> str:
        return self.metadata["name"]


def _spec(env: Any) -> NumbaEnv:
    """The NumbaEnv of ``env``: a NumbaEnv or a registered name."""
    if isinstance(env, NumbaEnv):
        return env
    if isinstance(env, str):
        return spec(env)
    raise UsageError(f"a PettingZoo face takes a NumbaEnv or a registered env name, got {type(env).__name__}")


def parallel_env(env: Any, seed: int = 0, **kwargs: Any) -> NumbaParallelEnv:
    """One copy of a Numba env (a NumbaEnv or a registered name) as a PettingZoo ParallelEnv."""
    return NumbaParallelEnv(env, seed=seed, **kwargs)


def aec_env(env: Any, seed: int = 0, **kwargs: Any) -> Any:
    """One copy of a Numba env as a PettingZoo AECEnv: NumbaAECEnv for a turn-based env, else PettingZoo's
    ``parallel_to_aec`` of the Parallel form."""
    if _spec(env).turns:
        return NumbaAECEnv(env, seed=seed, **kwargs)
    return parallel_to_aec(NumbaParallelEnv(env, seed=seed, **kwargs))
