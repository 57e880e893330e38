"""Numba envs whose copies hold several agents: rows, masks and flags laid out as ``vector.make`` lays out an
emulated PettingZoo ParallelEnv, so a learner cannot tell the two apart.

The contract (a :class:`~packrl.envs.numba_env.NumbaEnv` with ``agents=("a", "b", ...)``)::

    @njit
    def reset(state, obs, live, rng) -> None
    @njit
    def step(state, actions, obs, rewards, terminated, truncated, live, rng) -> None

``obs`` is this copy's observations with a leading agent axis: ``obs[a]`` for a Box observation, else one
typed array per leaf named by its Dict keys (``obs.image[a]``). ``actions[a]`` is agent ``a``'s policy-facing
action (``actions.discrete[a]`` / ``actions.continuous[a]`` for hybrid spaces). ``rewards``, ``terminated``,
``truncated`` are this copy's per-agent outputs (zero and False on entry). ``live[a]`` is true for the agents
alive now (the rows' masks): ``reset`` finds every agent live and clears the ones absent at the start; ``step``
ends an agent by setting its ``terminated`` or ``truncated`` (its last observation goes to
``final_observations``, its row becomes zeros and unmasked from the next step) and brings one in by setting
``live[a]`` and writing its observation. Agents not live are never stepped: ignore their actions. A copy whose
agents have all ended is reset in the same step (``autoreset = True``). ``rng`` is the copy's own random stream.

Rows: agent ``a`` of copy ``i`` is row ``i * num_agents_per_copy + a``; ``emulated`` holds one copy's groups (rows
``0 .. agents - 1``), ``possible_agents`` one copy's agents, ``agents_per_env`` their count: as
``vector.make(pettingzoo_env, num_envs, backend="serial")``. All agents share ``action_space``. Agents with
different observation spaces (``observation_space={agent: space}``) fall into groups as emulation groups a
PettingZoo env's agents, each group's agents adjacent in ``agents``; the rows are then packed bytes as wide as
the widest group's, and the kernels get ``obs`` as a tuple with one entry per group, in order of first appearance
(``obs[g][k]`` is the ``k``-th agent of group ``g``; a Dict group's entry holds its leaves by name).

Turn-based games (``NumbaEnv(..., turns=True)``, laid out as ``vector.make`` lays out an emulated AEC env):
``live`` marks the one agent due to move; ``reset`` and every ``step`` set it (``live[a] = a == mover``) and write
every agent's observation. Only the mover's action is read and only its row is shown (the others are zeros and
unmasked). A reward given to an agent is held until its next turn and delivered there (as PettingZoo's ``last()``
gives it). The game ends for all agents at once: set every agent's ``terminated`` (or ``truncated``); each
agent's last observation goes to ``final_observations`` with its flags and held rewards, and the copy is reset.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from packrl._codegen import Code
from packrl.emulation.emulated import Emulated, group_agents
from packrl.emulation.layout import Layout
from packrl.emulation.rows import row_format
from packrl.env_protocol import Batch
from packrl.envs.numba_env import _HEADER as _SINGLE_HEADER
from packrl.envs.numba_env import (
    BatchedNumbaEnv,
    KernelSource,
    LeafCheck,
    NumbaEnv,
    _as_shape,
    leaf_checks,
    leaf_problem,
    with_time_limit,
)
from packrl.envs.rng import RNG_WORDS
from packrl.errors import EnvError

_HEADER = _SINGLE_HEADER.replace("packrl.envs.numba_env for", "packrl.envs.numba_agents for") + "A = {agents}\n"


@dataclass(frozen=True)
class GroupSource:
    """One agent group's part of the kernels: its agents' rows in a copy (``first`` .. ``first + count - 1``)
    and its observation leaves' checks. A lone-Box group (``bare``) reaches the kernel as its view itself, a Dict
    or Tuple group as a record of leaf views (``Obs<index>``)."""

    index: int
    first: int
    count: int
    layout: Layout
    checks: tuple[LeafCheck, ...]

    @property
    def bare(self) -> bool:
        return self.layout.box is not None

    def arg(self, check: LeafCheck) -> str:
        return f"o{self.index}_{check.index}"

    def bound(self, side: str, check: LeafCheck) -> str:
        return f"{side}_{self.index}_{check.index}"

    def record(self) -> str:
        return "" if self.bare else f'Obs{self.index} = record("Obs{self.index}", {tuple(c.field for c in self.checks)!r})\n'

    def expr(self) -> str:
        if self.bare:
            return f"{self.arg(self.checks[0])}[i]"
        return f"Obs{self.index}(" + ", ".join(f"{self.arg(c)}[i]" for c in self.checks) + ")"


def group_sources(env: NumbaEnv, emulated: Emulated) -> tuple[GroupSource, ...]:
    """The kernels' view of each agent group; EnvError when a group's agents are not adjacent in ``agents``."""
    groups = []
    for g in emulated.groups:
        first, count = g.rows[0], len(g.rows)
        if tuple(g.rows) != tuple(range(first, first + count)):
            raise EnvError(f"numba env {env.name!r}: agents {list(g.agents)} share an observation space but are not "
                           f"adjacent in agents={list(env.agents)}; order the agents so that each group's are")
        groups.append(GroupSource(g.index, first, count, g.observation, leaf_checks(env, g.observation)))
    return tuple(groups)


class AgentsKernelSource(KernelSource):
    """The batched kernels of a NumbaEnv with agents: per copy, the user step over its agents' views, then the
    end of each agent that ended (final row, zeroed row, mask off), and the copy's reset when none is left.
    ``coded`` lists every checked leaf of every group; a bad element records its position there."""

    def __init__(self, env: NumbaEnv, emulated: Emulated, passthrough: bool):
        super().__init__(env, emulated.observation, emulated.action, passthrough)
        if not passthrough:
            self.row_shape = (emulated.nbytes,)
        self.groups = group_sources(env, emulated)
        self.coded = tuple((g, c) for g in self.groups for c in g.checks)
        self.checks = tuple(c for _, c in self.coded)
        self.constants = {}
        for g, c in self.coded:
            if c.kind == "range":
                self.constants[g.bound("LOW", c)], self.constants[g.bound("HIGH", c)] = c.low, c.high

    @property
    def obs_args(self) -> list[str]:
        return [g.arg(c) for g, c in self.coded]

    def _buffers(self) -> list[str]:
        return ["observations", *self.obs_args, "final_observations", "rng", "rewards", "terminals",
                "truncations", "masks", "before", "pending", "lengths", "bad"]

    def _obs_expr(self) -> str:
        if len(self.groups) == 1:
            return self.groups[0].expr()
        return "(" + ", ".join(g.expr() for g in self.groups) + ")"

    def _action_expr(self) -> str:
        rows = "i * A:(i + 1) * A"
        return f"Action(act_d[{rows}], act_c[{rows}])" if self.action.kind == "hybrid" else f"act[{rows}]"

    def _agent_checks(self, code: Code, code_offset: int, rows: str) -> None:
        """Check the leaves of the agents ``a`` of copy ``i`` where ``rows`` holds: a bad element records
        ``(position in coded + code_offset) * A + a`` in ``bad[i]`` and sets ``c = -1``."""
        for q, (g, c) in enumerate(self.coded):
            if c.kind == "none":
                continue
            with code.block(f"for k in range({g.count}):"):
                code(f"a = {g.first} + k")
                with code.block(f"if {rows}:"), code.loops(c.leaf.shape or (1,), var="j") as inner:
                    x = f"x{q}"
                    code(f"{x} = {g.arg(c)}[i, k, {inner}]")
                    cond = f"{x} != {x}" if c.kind == "nan" else \
                        f"{x} < {g.bound('LOW', c)}[{inner}] or {x} > {g.bound('HIGH', c)}[{inner}]"
                    with code.block(f"if {cond}:"):
                        code(f"bad[i] = ({code_offset + q}) * A + a", "c = -1")

    def _row_loops(self, code: Code, line: str) -> None:
        with code.loops(self.row_shape, var="j") as inner:
            code(line.format(j=inner))

    def _parallel_outcome(self, code: Code) -> None:
        """After a step of copy ``i``: each agent that was live and ended gets its final row, a zeroed row and its
        mask off; agents not stepped report nothing; ``alive`` counts the agents live now (joiners too)."""
        with code.block("for a in range(A):"):
            with code.block("if before[i, a]:"):
                code("if limit and not terminals[i, a]:", "    truncations[i, a] = True")
                with code.block("if terminals[i, a] or truncations[i, a]:"):
                    self._row_loops(code, "final_observations[i, a, {j}] = observations[i, a, {j}]")
                    self._row_loops(code, "observations[i, a, {j}] = 0")
                    code("masks[i, a] = False")
                with code.block("else:"):
                    code("masks[i, a] = True", "alive += 1")
            with code.block("else:"):  # not stepped: nothing of it is reported
                code("rewards[i, a] = 0.0", "terminals[i, a] = False", "truncations[i, a] = False")
                with code.block("if masks[i, a]:"):
                    code("alive += 1")
                with code.block("else:"):
                    self._row_loops(code, "observations[i, a, {j}] = 0")

    def _turns_outcome(self, code: Code) -> None:
        """After a turn-based step of copy ``i``: the game over (every row final, held rewards delivered) or the
        next mover's row shown with its held rewards."""
        code("over = limit")
        with code.block("for a in range(A):"):
            code("if terminals[i, a] or truncations[i, a]:", "    over = True")
        with code.block("if over:"), code.block("for a in range(A):"):
            code("if limit and not terminals[i, a]:", "    truncations[i, a] = True",
                 "rewards[i, a] += pending[i, a]", "pending[i, a] = 0.0")
            self._row_loops(code, "final_observations[i, a, {j}] = observations[i, a, {j}]")
            self._row_loops(code, "observations[i, a, {j}] = 0")
            code("masks[i, a] = False")
        with code.block("else:"), code.block("for a in range(A):"):
            code("pending[i, a] += rewards[i, a]", "rewards[i, a] = 0.0")
            with code.block("if masks[i, a]:"):
                code("rewards[i, a] = pending[i, a]", "pending[i, a] = 0.0", "alive += 1")
            with code.block("else:"):
                self._row_loops(code, "observations[i, a, {j}] = 0")

    def _reset_copy(self, code: Code) -> None:
        """Reset copy ``i``: rows zeroed, every agent live (turns: the user reset marks the mover), the user
        reset, rows of absent agents (turns: of those not to move) zeroed."""
        code("lengths[i] = 0")
        with code.block("for a in range(A):"):
            self._row_loops(code, "observations[i, a, {j}] = 0")
            code("masks[i, a] = True", "pending[i, a] = 0.0")
        code("user_reset(state, obs, masks[i], rng[i])")
        with code.block("for a in range(A):"), code.block("if not masks[i, a]:"):
            self._row_loops(code, "observations[i, a, {j}] = 0")

    def source(self) -> str:
        env = self.env
        obs_class = "".join(g.record() for g in self.groups)
        action_class = 'Action = record("Action", ("discrete", "continuous"))\n' if self.action.kind == "hybrid" else ""
        nleaves = len(self.checks)
        code = Code()
        code(_HEADER.format(name=env.name, state_fields=tuple(self.state_fields), obs_class=obs_class,
                            action_class=action_class, max_steps=int(env.max_episode_steps or 0), nleaves=nleaves,
                            agents=len(env.agents)))
        code(*(f"{name} = None" for name in self.constants))
        step_args = ", ".join(self.step_args())
        code("", "", "@njit(cache=True, nogil=True, _nrt=False)")
        with code.block(f"def _step_range(lo, hi, {step_args}):"):
            code("# copies lo .. hi - 1: (copies whose episode ended, copies that wrote a leaf out of its space)",
                 "ends = 0", "failed = 0")
            with code.block("for i in range(lo, hi):"):
                with code.block("for a in range(A):"):
                    code("before[i, a] = masks[i, a]", "rewards[i, a] = 0.0", "terminals[i, a] = False",
                         "truncations[i, a] = False")
                code(f"state = {self._state_expr()}", f"obs = {self._obs_expr()}",
                     f"user_step(state, {self._action_expr()}, obs, rewards[i], terminals[i], truncations[i], "
                     "masks[i], rng[i])",
                     "lengths[i] += 1", "limit = MAX_STEPS > 0 and lengths[i] >= MAX_STEPS", "c = 0")
                self._agent_checks(code, 0, "True" if self.env.turns else "before[i, a] or masks[i, a]")
                code("alive = 0")
                (self._turns_outcome if self.env.turns else self._parallel_outcome)(code)
                with code.block("if c == 0 and alive == 0:"):
                    self._reset_copy(code)
                    self._agent_checks(code, nleaves, "masks[i, a]")
                    code("if c == 0:", "    c = 1")
                code("failed += 1 if c < 0 else 0", "ends += c if c > 0 else 0")
            code("return ends, failed")

        self._step_drivers(code, step_args)
        code("", "", "@njit(cache=True, nogil=True, _nrt=False)")
        with code.block(f"def reset_all({', '.join(self.reset_args())}):"):
            code("n = rewards.shape[0]", "failed = 0")
            with code.block("for i in range(n):"):
                code("if seeded:", "    seed_rng(rng[i], seed + i)")
                with code.block("for a in range(A):"):
                    code("rewards[i, a] = 0.0", "terminals[i, a] = False", "truncations[i, a] = False")
                code(f"state = {self._state_expr()}", f"obs = {self._obs_expr()}", "c = 0")
                self._reset_copy(code)
                self._agent_checks(code, nleaves, "masks[i, a]")
                code("failed += 1 if c < 0 else 0")
            code("return failed")
        return code.text()


class BatchedNumbaAgents(BatchedNumbaEnv):
    """``num_envs`` copies of a NumbaEnv with ``agents``, one row per agent of each copy (``num_agents =
    num_envs * agents_per_env``), stepped by one compiled call. Rows, masks, flags, ``emulated`` and
    ``possible_agents`` as ``vector.make`` gives them for the PettingZoo form of the env; copies whose agents
    have all ended are reset in the same step (``final_observations`` holds the ended agents' last rows)."""

    def __init__(self, env: NumbaEnv, num_envs: int, seed: int = 0, threads: int | None = None,
                 episode_infos: bool = False, max_episode_steps: int | None = None):
        if not isinstance(env, NumbaEnv) or not env.agents:
            raise EnvError(f"BatchedNumbaAgents takes a NumbaEnv with agents, got {env!r:.80}")
        env = with_time_limit(env, max_episode_steps)
        if isinstance(num_envs, bool) or int(num_envs) < 1:
            raise EnvError(f"numba env {env.name!r}: num_envs must be >= 1, got {num_envs}")
        self.numba_env, self.name = env, env.name
        self.num_envs = n = int(num_envs)
        self.agents_per_env = per = len(env.agents)
        self.num_agents = n * per
        self.seed = int(seed)
        self.episode_infos = False  # PPO counts returns from the rows; per-copy episode infos are not kept
        self.possible_agents = self.agents = tuple(env.agents)
        self.emulated = group_agents(self.agents, {agent: env.observation_space_of(agent) for agent in self.agents},
                                     dict.fromkeys(self.agents, env.action_space))
        self.passthrough, self.single_observation_space, obs_shape, obs_dtype = row_format(self.emulated)
        self.single_action_space = self.emulated.action.policy_space
        self.observation_space = batch_space(self.single_observation_space, self.num_agents)
        self.action_space = batch_space(self.single_action_space, self.num_agents)
        self.closed = False
        self._setup_kernels(AgentsKernelSource(env, self.emulated, self.passthrough), threads)

        rows = self.num_agents
        self.observations = np.zeros((rows, *obs_shape), obs_dtype)
        self.final_observations = np.zeros_like(self.observations)
        self.rewards = np.zeros(rows, np.float32)
        self.terminals = np.zeros(rows, bool)
        self.truncations = np.zeros(rows, bool)
        self.masks = np.ones(rows, bool)
        self.state = {key: np.zeros((n, *_as_shape(shape)), np.dtype(dtype)) for key, (shape, dtype) in env.state.items()}
        self.rng = np.zeros((n, RNG_WORDS), np.uint64)
        self._before = np.zeros((n, per), bool)
        self._pending = np.zeros((n, per), np.float32)  # turns: rewards held until each agent's next turn
        self._lengths = np.zeros(n, np.int64)
        self._bad = np.full(n, -1, np.int64)
        self._seeded = False
        self._module = None
        self._bind()
        self.compile_records = self._compile()

    def _bind(self) -> None:
        """Per-group, per-leaf typed views ``(copies, group's agents, *leaf)`` of the rows, and the kernels'
        argument tuples."""
        n, per = self.num_envs, self.agents_per_env
        by_copy = self.observations.reshape(n, per, *self.observations.shape[1:])
        self.group_views: list[dict[str, np.ndarray]] = []
        for g in self._source.groups:
            rows = by_copy[:, g.first: g.first + g.count]
            if self.passthrough:
                views = {g.checks[0].field: rows if rows.ndim > 2 else rows.reshape(n, g.count, 1)}
            else:
                views = {c.field: rows[:, :, c.leaf.offset: c.leaf.offset + c.leaf.nbytes].view(c.leaf.dtype).reshape(
                    (n, g.count, *(c.leaf.shape or (1,)))) for c in g.checks}
            self.group_views.append(views)
        leaves = [self.group_views[g.index][c.field] for g, c in self._source.coded]
        final = self.final_observations.reshape(by_copy.shape)
        two = (n, per)
        buffers = (by_copy, *leaves, final, self.rng, self.rewards.reshape(two), self.terminals.reshape(two),
                   self.truncations.reshape(two), self.masks.reshape(two), self._before, self._pending, self._lengths, self._bad)
        self._step_tail = (*self.state.values(), *buffers)
        self._reset_tail = self._step_tail

    @property
    def episode_steps(self) -> np.ndarray:
        """Steps into its current episode, per copy (0 right after a reset, a same-step autoreset included)."""
        return self._lengths

    @property
    def compile_report(self) -> str:
        return super().compile_report.replace(f"x{self.num_envs} (", f"x{self.num_envs} copies of {self.agents_per_env} agents (")

    def set_buffers(self, observations: np.ndarray, final_observations: np.ndarray, rewards: np.ndarray,
                    terminals: np.ndarray, truncations: np.ndarray, masks: np.ndarray) -> None:
        """Write into arrays owned by someone else (keeping the live masks the kernels keep)."""
        live = self.masks.copy()
        super().set_buffers(observations, final_observations, rewards, terminals, truncations, masks)
        self.masks[:] = live

    def recv(self) -> Any:
        """The last reset or step as a batch of every copy (one infos dict per copy)."""
        self._check_open()
        return Batch(self.observations, self.rewards, self.terminals, self.truncations,
                     [{} for _ in range(self.num_envs)], np.arange(self.num_envs), self.masks, self.final_observations)

    def _raise_leaf_error(self, phase: str) -> None:
        rows = np.flatnonzero(self._bad >= 0)
        i = int(rows[0])
        code, agent = divmod(int(self._bad[i]), self.agents_per_env)
        self._bad[rows] = -1
        nleaves = len(self._source.coded)
        where = "reset (after its agents ended)" if (phase == "step" and code >= nleaves) else phase
        group, check = self._source.coded[code % nleaves]
        what = leaf_problem(check, self.group_views[group.index][check.field][i, agent - group.first])
        others = f"; {len(rows) - 1} other copies failed too" if len(rows) > 1 else ""
        raise EnvError(f"numba env {self.name!r}, env index {i}, agent {self.agents[agent]!r}: its {where} kernel "
                       f"wrote {what} into observation leaf {check.leaf.name!r} ({check.leaf.space}){others}. "
                       "Other copies' rows are intact.", env_index=i)

    def __repr__(self) -> str:
        return f"BatchedNumbaAgents({self.name!r}, num_envs={self.num_envs}, agents={list(self.agents)}, threads={self.threads})"
