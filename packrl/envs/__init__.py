"""Envs shipped with packrl, written as Numba kernels (see ``packrl.envs.numba_env``).

``packrl.envs.make("cartpole", num_envs=64)`` gives a batched env that follows packrl's env
protocol (``autoreset = True``), usable alone, as ``vector.make(..., backend="numba")``, or one per
multiprocessing worker. ``packrl.envs.spec(name)`` gives the :class:`NumbaEnv` itself, and
``register(name, factory)`` adds your own.
"""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any, Callable

from packrl.errors import EnvError

if TYPE_CHECKING:
    from packrl.envs.numba_env import BatchedNumbaEnv, NumbaEnv


def __getattr__(name: str) -> Any:
    """``BatchedNumbaEnv`` and ``NumbaEnv`` on first use: looking up an env id (``names()``) does not import
    Numba, so the command line refuses a mistyped id before Numba's import time."""
    if name in ("BatchedNumbaEnv", "NumbaEnv"):
        from packrl.envs import numba_env

        return getattr(numba_env, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_REGISTRY: dict[str, Callable[[], NumbaEnv]] = {}


def register(name: str, factory: Callable[[], NumbaEnv]) -> None:
    """Make ``factory()`` (returning a NumbaEnv) available as ``make(name)``."""
    _REGISTRY[name] = factory


def names() -> list[str]:
    """Names of the registered envs."""
    return sorted(_REGISTRY)


def spec(name: str) -> NumbaEnv:
    """The NumbaEnv registered as ``name``."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise EnvError(f"no packrl env named {name!r}; registered: {names()}") from None
    return factory()


def make(name: str, num_envs: int = 1, seed: int = 0, threads: int | None = None, **kwargs: Any) -> BatchedNumbaEnv:
    """``num_envs`` copies of the env ``name`` stepped by one compiled call (see BatchedNumbaEnv; an env with
    agents gives a BatchedNumbaAgents, one row per agent of each copy)."""
    return batched(spec(name), num_envs, seed=seed, threads=threads, **kwargs)


def batched(env: NumbaEnv, num_envs: int, **kwargs: Any) -> BatchedNumbaEnv:
    """``num_envs`` copies of ``env``: a BatchedNumbaEnv, or a BatchedNumbaAgents for an env with agents."""
    if getattr(env, "agents", ()):
        from packrl.envs.numba_agents import BatchedNumbaAgents

        return BatchedNumbaAgents(env, num_envs, **kwargs)
    from packrl.envs.numba_env import BatchedNumbaEnv

    return BatchedNumbaEnv(env, num_envs, **kwargs)


SHIPPED = ("cartpole", "gridworld", "simple_spread", "simple_tag", "connect_four", "aim")
"""The envs packrl ships: module ``packrl.envs.<name>`` with a ``spec()`` (imported on first use: Numba)."""


def _shipped(name: str) -> NumbaEnv:
    return importlib.import_module(f"packrl.envs.{name}").spec()


for _name in SHIPPED:
    register(_name, functools.partial(_shipped, _name))

__all__ = ["BatchedNumbaEnv", "NumbaEnv", "batched", "make", "names", "register", "spec"]
