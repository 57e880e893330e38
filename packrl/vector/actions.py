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

from packrl.emulation.values import _any_outside
from packrl.errors import EmulationError

_INT64 = np.dtype(np.int64)


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
    """Checks a batch of policy actions and copies it into the action arrays."""

    def __init__(self, space: spaces.Space, arrays: dict[str, np.ndarray], agents_per_env: int):
        self.space = space
        self.arrays = arrays
        self.agents_per_env = agents_per_env
        self.leaves = _leaves(space, "actions", ())
        # a Discrete action space: its inclusive range, for the one-pass check of the commonest batch
        self._choices = (int(space.start), int(space.start) + int(space.n) - 1) if isinstance(space, spaces.Discrete) else None

    def write(self, actions: Any, rows: Any, env_ids: np.ndarray) -> None:
        """Check ``actions`` (leading axis: one entry per row) and write them at ``rows``
        (a slice or an index array of the target rows)."""
        n = len(env_ids) * self.agents_per_env
        if (self._choices is not None and actions.__class__ is np.ndarray and actions.shape == (n,)
                and actions.dtype is _INT64 and n and not _any_outside(actions, *self._choices)):
            self.arrays["actions"][rows] = actions
            return
        checked = []
        for name, path, sub in self.leaves:
            value = _get(actions, path, self.space)
            checked.append((name, _check(value, sub, n, path, env_ids, self.agents_per_env)))
        for name, value in checked:  # nothing is written unless every leaf passed
            self.arrays[name][rows] = value


def _leaves(space: spaces.Space, name: str, path: tuple) -> list:
    if isinstance(space, spaces.Dict):
        out = []
        for key, sub in space.spaces.items():
            out += _leaves(sub, f"{name}.{key}", path + (key,))
        return out
    return [(name, path, space)]


def _get(actions: Any, path: tuple, space: spaces.Space) -> Any:
    for key in path:
        if not isinstance(actions, dict) or set(actions) != set(space.spaces):
            got = sorted(actions) if isinstance(actions, dict) else type(actions).__name__
            raise EmulationError(f"actions must be a dict with keys {sorted(space.spaces)}, got {got}")
        actions, space = actions[key], space.spaces[key]
    return actions


def _where(path: tuple) -> str:
    return f"actions[{path[0]!r}]" if path else "actions"


def _check(value: Any, space: spaces.Space, n: int, path: tuple, env_ids: np.ndarray, agents: int) -> np.ndarray:
    """``value`` as an array of n actions of ``space``; refuse anything else with the first bad row."""
    arr = value if type(value) is np.ndarray else np.asarray(value)
    shape = (n, *space.shape)
    if isinstance(space, spaces.Discrete) and arr.shape == (n, 1):
        arr = arr.reshape(n)  # a (rows, 1) column is the same actions
    if arr.shape != shape:
        raise EmulationError(f"{_where(path)} has shape {arr.shape}, expected {shape} ({n} rows of {space})")
    if isinstance(space, spaces.Box) and space.dtype.kind == "f":
        if arr.dtype.kind != "f":
            raise EmulationError(f"{_where(path)} has dtype {arr.dtype}; {space} takes floats")
        with np.errstate(invalid="ignore"):
            bad = ~((arr >= space.low) & (arr <= space.high))
        if bad.any():
            _refuse(bad, arr, _where(path), "outside the Box bounds or not a number", env_ids, agents)
        return arr
    if arr.dtype.kind not in "iu":
        raise EmulationError(f"{_where(path)} has dtype {arr.dtype}; {space} takes integers")
    low, high = _int_bounds(space)
    bad = (arr < low) | (arr > high)
    if bad.any():  # the message (str of the space) is built only for a refusal
        _refuse(bad, arr, _where(path), f"outside [{np.min(low)}, {np.max(high)}] of {space}", env_ids, agents)
    return arr


def _int_bounds(space: spaces.Space) -> tuple[Any, Any]:
    if isinstance(space, spaces.Discrete):
        return int(space.start), int(space.start) + int(space.n) - 1
    if isinstance(space, spaces.MultiDiscrete):
        return space.start, space.start + space.nvec - 1
    if isinstance(space, spaces.MultiBinary):
        return 0, 1
    return space.low, space.high  # an integer Box


def _refuse(bad: np.ndarray, arr: np.ndarray, where: str, why: str, env_ids: np.ndarray, agents: int) -> None:
    row = int(np.argwhere(bad.reshape(len(bad), -1).any(axis=1))[0, 0])
    env, agent = int(env_ids[row // agents]), row % agents
    raise EmulationError(f"{where} row {row} (env {env}, agent {agent}) = {arr[row].tolist()} is {why}; "
                         f"refused before reaching the envs")
