"""Actions for many rows: checked in the main process, written into the shared action arrays.

The policy-facing action space (Discrete, MultiDiscrete, MultiBinary, Box, or the hybrid
``Dict(discrete=..., continuous=...)``) gets one array per leaf with a leading rows axis.
Wrong shape, wrong dtype kind or a value out of range is refused here with the row and env
index, so a bad action never reaches a worker.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from packrl.emulation.actions import ActionLayout, ContinuousPart, outside_choices
from packrl.emulation.tree import iter_leaves
from packrl.emulation.values import outside_bounds
from packrl.errors import EmulationError


def action_arrays(space: spaces.Space, rows: int) -> dict[str, tuple[tuple, np.dtype]]:
    """Name -> (shape, dtype) of the arrays that hold ``rows`` actions of ``space``."""
    if isinstance(space, spaces.Dict):
        out = {}
        for key, sub in space.spaces.items():
            out.update({f"actions.{key}{k[len('actions'):]}": v for k, v in action_arrays(sub, rows).items()})
        return out
    if isinstance(space, spaces.Discrete):
        return {"actions": ((rows,), np.dtype(np.int64))}
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        return {"actions": ((rows, *space.shape), np.dtype(np.int64))}
    if isinstance(space, spaces.Box):
        return {"actions": ((rows, *space.shape), np.dtype(space.dtype))}
    raise EmulationError(f"vector backends cannot carry actions of {space}; emulate the env first")


def action_views(space: spaces.Space, arrays: dict[str, np.ndarray], rows: slice, prefix: str = "actions") -> Any:
    """The actions of ``rows`` in the form an env's ``step`` takes (a dict for the hybrid space)."""
    if isinstance(space, spaces.Dict):
        return {key: action_views(sub, arrays, rows, f"{prefix}.{key}") for key, sub in space.spaces.items()}
    return arrays[prefix][rows]


class ActionWriter:
    """Checks a batch of policy actions and copies it into the action arrays. The values are checked
    by the policy space's action layout (``ActionLayout.check_batch``, packrl's one action checker,
    one C call for the commonest batches); shapes and dtype kinds here."""

    def __init__(self, space: spaces.Space, arrays: dict[str, np.ndarray], agents_per_env: int):
        self.space = space
        self.arrays = arrays
        self.agents_per_env = agents_per_env
        self.checker = ActionLayout(space)
        self.leaves = [("".join(["actions", *(f".{k}" for k in path)]), path, node.codec.space)
                       for path, node in iter_leaves(self.checker.layout.root)]  # (array name, path, space)
        parts = {p.path: p for p in self.checker.discrete_parts + self.checker.continuous_parts}
        self.parts = [parts[path] for _, path, _ in self.leaves]
        # the leaves of each part the checker reads (none where the part has no elements)
        self.discrete = [p.path for p in self.checker.discrete_parts] if self.checker.num_discrete else []
        self.continuous = [p.path for p in self.checker.continuous_parts] if self.checker.num_continuous else []
        # a Discrete(n, start) policy space holds values from start: the checker counts choices from 0
        self.starts = {p.path: p.start for p in self.checker.discrete_parts if np.any(p.start != 0)}

    def write(self, actions: Any, rows: Any, env_ids: np.ndarray) -> None:
        """Check ``actions`` (leading axis: one entry per row) and write them at ``rows``
        (a slice or an index array of the target rows)."""
        n = len(env_ids) * self.agents_per_env
        if not isinstance(self.space, spaces.Dict):  # the commonest batch: one array
            values = {(): _checked_form(actions, self.space, n, ())}
        else:
            values = {path: _checked_form(_get(actions, path, self.space), sub, n, path) for _, path, sub in self.leaves}
        if self.checker.check_batch(self._part(values, self.discrete, n), self._part(values, self.continuous, n)) >= 0:
            self._refuse(values, env_ids)
        for name, path, _ in self.leaves:  # nothing is written unless every leaf passed
            self.arrays[name][rows] = values[path]

    def _part(self, values: dict, paths: list, n: int) -> np.ndarray | None:
        """The checker's (rows, elements) part from the leaves' arrays (no copy for one plain leaf)."""
        if not paths:
            return None
        arrays = [values[p] - self.starts[p] if p in self.starts else values[p] for p in paths]
        if len(arrays) == 1:
            return arrays[0] if arrays[0].ndim == 1 else arrays[0].reshape(n, -1)
        return np.concatenate([a.reshape(n, -1) for a in arrays], axis=1)

    def _refuse(self, values: dict, env_ids: np.ndarray) -> None:
        """Name the first leaf with a value outside the space, at its first bad row."""
        for (_, path, sub), part in zip(self.leaves, self.parts):
            arr = values[path]
            if isinstance(part, ContinuousPart):
                _refuse(outside_bounds(arr, part.low, part.high), arr, _where(path),
                        "outside the Box bounds or not a number", env_ids, self.agents_per_env)
            else:
                low = part.start
                choices = arr - low if path in self.starts else arr
                _refuse(outside_choices(choices, part.nvec), arr, _where(path),
                        f"outside [{np.min(low)}, {np.max(low + part.nvec - 1)}] of {sub}", env_ids, self.agents_per_env)


def _get(actions: Any, path: tuple, space: spaces.Space) -> Any:
    for key in path:
        if not isinstance(actions, dict) or set(actions) != set(space.spaces):
            got = sorted(actions) if isinstance(actions, dict) else type(actions).__name__
            raise EmulationError(f"actions must be a dict with keys {sorted(space.spaces)}, got {got}")
        actions, space = actions[key], space.spaces[key]
    return actions


def _where(path: tuple) -> str:
    return f"actions[{path[0]!r}]" if path else "actions"


def _checked_form(value: Any, space: spaces.Space, n: int, path: tuple) -> np.ndarray:
    """``value`` as an array of n actions of ``space`` (its shape and dtype kind; the values are the
    checker's); refuse anything else."""
    arr = value if type(value) is np.ndarray else np.asarray(value)
    shape = (n, *space.shape)
    if isinstance(space, spaces.Discrete) and arr.shape == (n, 1):
        arr = arr.reshape(n)  # a (rows, 1) column is the same actions
    if arr.shape != shape:
        raise EmulationError(f"{_where(path)} has shape {arr.shape}, expected {shape} ({n} rows of {space})")
    if isinstance(space, spaces.Box) and space.dtype.kind == "f":
        if arr.dtype.kind != "f":
            raise EmulationError(f"{_where(path)} has dtype {arr.dtype}; {space} takes floats")
    elif arr.dtype.kind not in "iu":
        raise EmulationError(f"{_where(path)} has dtype {arr.dtype}; {space} takes integers")
    return arr


def _refuse(bad: np.ndarray, arr: np.ndarray, where: str, why: str, env_ids: np.ndarray, agents: int) -> None:
    """Raise, naming the first row where ``bad`` holds (nothing if it holds nowhere)."""
    if not bad.any():
        return
    row = int(np.argwhere(bad.reshape(len(bad), -1).any(axis=1))[0, 0])
    env, agent = int(env_ids[row // agents]), row % agents
    raise EmulationError(f"{where} row {row} (env {env}, agent {agent}) = {arr[row].tolist()} is {why}; "
                         f"refused before reaching the envs")
