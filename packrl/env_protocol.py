"""What an env must offer to be stepped by the vector backends, and what a batch of them returns.

A neutral module: the emulations (``packrl.emulation``), the Numba envs (``packrl.envs``) and the
vector backends (``packrl.vector``) all read it, and it imports none of them, so none of those
packages imports another to reach these names.

- ``RowEnv``: an env that writes its step into rows of arrays it is handed (``set_buffers``):
  every emulated env (``packrl.emulation.emulate``) and every env a creator gives ``vector.make``
  after emulation. ``autoreset = False`` means the caller resets it on the step ``done`` turns
  true (the vector backends do, in that same step). ``step_many`` is optional: a class that
  defines it steps a block of its envs in one call (``BlockStepper``).
- ``Batch``: what ``recv`` returns. ``SAME_STEP``: gymnasium's name for the autoreset mode of
  every packrl vector env (the next episode's first observation on the step the last one ends).
- ``NoEnvObjects``: the per-env calls of a vector env whose copies are rows of one compiled state.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from packrl.errors import UsageError

try:  # gymnasium >= 1.1 names the autoreset modes
    from gymnasium.vector import AutoresetMode

    SAME_STEP: Any = AutoresetMode.SAME_STEP
except ImportError:  # pragma: no cover
    SAME_STEP = "SameStep"

ROW_BUFFERS = ("observations", "final_observations", "rewards", "terminals", "truncations", "masks")
"""The arrays ``set_buffers`` takes, in its argument order; each has one row per agent."""


class Batch(NamedTuple):
    """What ``recv`` returns: rows of the envs in ``env_ids`` (each env: ``agents_per_env``
    consecutive rows, in the order of ``env_ids``). Arrays stay valid until the next ``send``."""

    observations: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    truncations: np.ndarray
    infos: list
    env_ids: np.ndarray
    masks: np.ndarray
    final_observations: np.ndarray


@runtime_checkable
class RowEnv(Protocol):
    """An env whose step writes one row per agent into arrays it was handed."""

    num_agents: int
    autoreset: bool
    emulated: Any  # packrl.emulation.Emulated: the layouts of its rows
    possible_agents: tuple
    single_observation_space: Any
    single_action_space: Any
    observations: np.ndarray
    final_observations: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    truncations: np.ndarray
    masks: np.ndarray

    @property
    def done(self) -> bool:
        """The last step ended the episode: reset before stepping again."""

    def set_buffers(self, observations: np.ndarray, final_observations: np.ndarray, rewards: np.ndarray,
                    terminals: np.ndarray, truncations: np.ndarray, masks: np.ndarray) -> None:
        """Write into these rows (``num_agents`` of each) from now on."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, Any]: ...

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any]: ...

    def close(self) -> None: ...


class BlockPosition:
    """Where a block step stopped: ``step_many`` sets ``index`` to the position (in the block) of
    the env whose step, value or observation raised, before the exception leaves it. A field the
    caller owns, rather than an attribute put on whatever exception the env raised."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index = 0


@runtime_checkable
class BlockStepper(RowEnv, Protocol):
    """A ``RowEnv`` whose class can step several of its envs at once.

    ``step_many(envs, actions, rows, position)``: ``envs`` are instances of the class with equal
    ``emulated`` layouts whose rows are consecutive; ``rows`` maps each name of ``ROW_BUFFERS``
    but ``masks`` to exactly their rows; ``actions`` has one policy-facing action per env.
    Returns (one info per env, positions of the envs whose episode ended). Same checks and bytes
    as ``step`` on each; on an exception ``position.index`` names the env."""

    @staticmethod
    def step_many(envs: list, actions: Any, rows: dict[str, np.ndarray],
                  position: BlockPosition) -> tuple[list[dict], np.ndarray]: ...


def block_stepper(envs: list) -> Any:
    """The ``step_many`` that steps all of ``envs`` together, or None: they must be of one class
    that defines it and share their layouts."""
    cls = type(envs[0])
    step_many = getattr(cls, "step_many", None)
    if step_many is None or any(type(env) is not cls for env in envs):
        return None
    first = envs[0].emulated
    return step_many if all(env.emulated == first for env in envs) else None


class NoEnvObjects:
    """For vector envs whose copies are rows of one compiled state (the Numba backend): there is no
    env object per copy to call, so these say what to use instead."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple:
        raise UsageError(self._no_objects(f"call({name!r})"))

    def get_attr(self, name: str) -> tuple:
        raise UsageError(self._no_objects(f"get_attr({name!r})"))

    def set_attr(self, name: str, values: Any) -> None:
        raise UsageError(self._no_objects(f"set_attr({name!r}, ...)"))

    def render(self) -> tuple:
        raise UsageError(self._no_objects("render()"))

    def _no_objects(self, what: str) -> str:
        return (f"{what}: the copies of a Numba env are rows of one compiled state, not env objects; read or "
                "write their state arrays (env.state[name][copy]) and rows (env.observations) directly, or run "
                "the env under backend 'serial'/'multiprocessing' for per-env calls")
