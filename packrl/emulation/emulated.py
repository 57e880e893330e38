"""What an emulated env exposes about its spaces: groups of agents that share layouts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from packrl.emulation.actions import ActionLayout
from packrl.emulation.layout import Layout
from packrl.errors import EmulationError


@dataclass(frozen=True)
class Group:
    """Agents whose observation and action spaces are equal: one layout pair, many rows."""

    index: int
    agents: tuple
    rows: tuple[int, ...]
    observation: Layout
    action: ActionLayout
    action_mask: tuple | None = None  # path of the observation leaf that masks actions, if any


@dataclass(frozen=True)
class Emulated:
    """Layouts of an emulated env. ``observation``/``action`` are the first group's."""

    agents: tuple
    groups: tuple[Group, ...]
    row_group: tuple[int, ...] = field(default=())

    @property
    def observation(self) -> Layout:
        return self.groups[0].observation

    @property
    def action(self) -> ActionLayout:
        return self.groups[0].action

    @property
    def action_mask(self) -> tuple | None:
        return self.groups[0].action_mask

    @property
    def heterogeneous(self) -> bool:
        return len(self.groups) > 1

    @property
    def nbytes(self) -> int:
        """Row width: the widest observation layout, rounded up to every group's alignment so that
        each group's typed views stay aligned in every row of a ``(rows, nbytes)`` buffer."""
        widest = max(g.observation.nbytes for g in self.groups)
        align = max(g.observation.alignment for g in self.groups)
        return -(-widest // align) * align

    def rows_for(self, rows: Any, group: Group | int) -> Any:
        """The rows of one group, cut to that group's layout width: ``rows[..., group.rows, :nbytes]``.

        ``rows`` is ``(..., num_agents, row_nbytes)`` (numpy or torch); the result goes straight to
        ``nativize(result, group.observation)``. A group whose rows are consecutive gets a view."""
        group = self.groups[group] if isinstance(group, (int, np.integer)) else group
        first, last = group.rows[0], group.rows[-1]
        if list(group.rows) == list(range(first, last + 1)):
            return rows[..., first: last + 1, : group.observation.nbytes]
        return rows[..., list(group.rows), : group.observation.nbytes]

    def row_of(self, agent: Any) -> int:
        """The row of ``agent``, given by name or by row number. An int that is one agent's name and
        another agent's row is refused as ambiguous (``row_of_agent``/``*_for_row`` say which)."""
        if type(agent) is int or isinstance(agent, np.integer):
            named = self.agents.index(agent) if agent in self.agents else None
            in_range = 0 <= agent < len(self.agents)
            if named is not None and in_range and named != agent:
                raise EmulationError(
                    f"{agent!r} is ambiguous: it names agent {agent!r} (row {named}) and is the row of agent "
                    f"{self.agents[int(agent)]!r}; use observation_for_agent/action_for_agent/row_of_agent for a "
                    "name, observation_for_row/action_for_row for a row")
            if named is None and in_range:
                return int(agent)
        return self.row_of_agent(agent)

    def row_of_agent(self, agent: Any) -> int:
        """The row of the agent named ``agent`` (names only: an int is a name here)."""
        try:
            return self.agents.index(agent)
        except ValueError:
            raise EmulationError(f"agent {agent!r} is not one of the env's possible agents {list(self.agents)}") from None

    def _row(self, row: Any) -> int:
        if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)) or not 0 <= row < len(self.agents):
            raise EmulationError(f"row {row!r} is not a row of this env: rows are 0..{len(self.agents) - 1}")
        return int(row)

    def group_for(self, agent: Any) -> Group:
        """The group of an agent, by name or row (``row_of``: an ambiguous int is refused)."""
        return self.groups[self.row_group[self.row_of(agent)]]

    def observation_for(self, agent: Any) -> Layout:
        """One agent's observation layout, by name or row (an ambiguous int is refused)."""
        return self.group_for(agent).observation

    def action_for(self, agent: Any) -> ActionLayout:
        """One agent's action layout, by name or row (an ambiguous int is refused)."""
        return self.group_for(agent).action

    def observation_for_agent(self, agent: Any) -> Layout:
        return self.groups[self.row_group[self.row_of_agent(agent)]].observation

    def action_for_agent(self, agent: Any) -> ActionLayout:
        return self.groups[self.row_group[self.row_of_agent(agent)]].action

    def observation_for_row(self, row: int) -> Layout:
        return self.groups[self.row_group[self._row(row)]].observation

    def action_for_row(self, row: int) -> ActionLayout:
        return self.groups[self.row_group[self._row(row)]].action


def group_agents(agents: tuple, observation_spaces: dict, action_spaces: dict, round_floats: bool = False,
                 action_mask_key: str | None = "action_mask") -> Emulated:
    """Group agents with equal spaces (in order of first appearance) and build one layout pair per group."""
    keys: list[tuple[Layout, ActionLayout]] = []
    members: list[list[int]] = []
    row_group = []
    for row, agent in enumerate(agents):
        try:
            obs = Layout.from_space(observation_spaces[agent], round_floats=round_floats)
            act = ActionLayout(action_spaces[agent])
        except EmulationError as err:
            raise EmulationError(f"agent {agent!r}: {err}") from None
        for g, (o, a) in enumerate(keys):  # noqa: B007 - g is the matching group after the break
            if o == obs and a == act:
                break
        else:
            g = len(keys)
            keys.append((obs, act))
            members.append([])
        members[g].append(row)
        row_group.append(g)
    groups = tuple(
        Group(g, tuple(agents[r] for r in rows), tuple(rows), obs, act, _mask_path(obs, act, action_mask_key))
        for g, ((obs, act), rows) in enumerate(zip(keys, members))
    )
    return Emulated(tuple(agents), groups, tuple(row_group))


def _mask_path(obs: Layout, act: ActionLayout, key: str | None) -> tuple | None:
    """The observation leaf named ``key`` at the top of a Dict, if it can mask the action branches."""
    if key is None or not isinstance(obs.space, spaces.Dict) or key not in obs.space.spaces:
        return None
    width = sum(int(n) for n in act.nvec)
    leaf = next(leaf for leaf in obs.leaves if leaf.path == (key,))
    if int(np.prod(leaf.shape)) != width:
        raise EmulationError(
            f"observation leaf {key!r} has {int(np.prod(leaf.shape))} entries but the action space has {width} "
            "choices; pass action_mask_key=None if this leaf is not an action mask")
    return (key,)
