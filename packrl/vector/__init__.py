"""Vectorization: many envs behind one set of shared ``(num_agents, nbytes)`` arrays.

``make(env_creator, num_envs, backend=...)`` returns a vector env with ``reset``/``step``
(all envs at once) and ``async_reset``/``recv``/``send`` (EnvPool-style batches); see
``VectorEnv`` for what they return and how episode ends show.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from packrl import envs
from packrl.errors import UsageError
from packrl.vector.autoreset import DISABLED, NEXT_STEP, SAME_STEP, WORKER_BACKENDS, check_mode, name_of
from packrl.vector.base import Batch, VectorEnv, check_seed
from packrl.vector.halves import NumbaHalves
from packrl.vector.infos import check_form
from packrl.vector.multiprocessing import Multiprocessing
from packrl.vector.serial import Serial

BACKENDS = ("serial", "multiprocessing", "numba", "ray")


def make(env_creator: Callable[[], Any], num_envs: int, backend: str = "serial", num_workers: int | None = None,
         batch_size: int | None = None, seed: int = 0, infos: str | None = None, autoreset_mode: Any = SAME_STEP,
         **kwargs: Any) -> Any:
    """Build ``num_envs`` envs from ``env_creator`` (a gymnasium.Env, a PettingZoo env or an
    emulated env; what is not emulated gets ``packrl.emulation.emulate``).

    backend: ``serial`` (this process), ``multiprocessing`` (``num_workers`` processes sharing
    memory; ``context=`` picks spawn, forkserver or fork; ``main_envs=`` how many envs the main
    process steps itself while the workers step theirs, by default an equal share when
    ``batch_size == num_envs``, ``0`` to keep every env out of this process), ``numba`` (``env_creator`` is a
    Numba batched env, see ``packrl.vector.numba_backend``; ``halves=True``: as two batched envs of half each, which
    ``PPOConfig.overlap`` steps in turn, ``packrl.vector.halves``) or ``ray`` (Ray actors, on one machine or
    a cluster; ``actor_options=`` go to every actor, see ``packrl.vector.ray_backend``).
    ``seed``: env i is seeded with ``seed + i`` on the first ``reset``.
    ``infos``: ``"list"`` (one dict per env, the default) or ``"dict"`` (gymnasium's dict of arrays
    with ``_key`` masks, for gymnasium's vector wrappers; ``packrl.vector.infos``). The Numba backend
    returns one dict of per-copy arrays (``None`` or ``"dict"``).
    ``autoreset_mode``: gymnasium's ``AutoresetMode`` (or its name): ``SAME_STEP`` (the default),
    ``NEXT_STEP`` (what gymnasium's observation wrappers need) or ``DISABLED`` (reset with
    ``reset(options={"reset_mask": mask})``); serial and multiprocessing backends only
    (``packrl.vector.autoreset``).

    Misuse (an env id or an env instance where a creator goes, an unknown backend, workers that do not
    divide the envs) raises ``packrl.UsageError``."""
    _require_creator(env_creator, backend)
    if backend == "numba" and infos not in (None, "dict"):
        raise UsageError(f"infos={infos!r}: backend 'numba' returns one dict of per-copy arrays (infos=None or 'dict')")
    form = None if infos is None or backend == "numba" else check_form(infos)  # checked before any env exists
    mode = check_mode(autoreset_mode)
    if mode != SAME_STEP:
        if backend in BACKENDS and backend not in WORKER_BACKENDS:
            raise UsageError(f"autoreset_mode={name_of(mode)}: backend {backend!r} offers SAME_STEP only; use "
                             f"backend 'serial' or 'multiprocessing'")
        kwargs["autoreset_mode"] = mode
    env = _make(env_creator, num_envs, backend, num_workers, batch_size, seed, **kwargs)
    if form is not None:
        env.info_format = form
    return env


def _make(env_creator: Callable[[], Any], num_envs: int, backend: str, num_workers: int | None,
          batch_size: int | None, seed: int, **kwargs: Any) -> Any:
    _require_int("num_envs", num_envs)
    for name, value in (("num_workers", num_workers), ("batch_size", batch_size)):
        if value is not None:
            _require_int(name, value)
    check_seed(seed, num_envs)
    if backend == "serial":
        if num_workers not in (None, 1):
            raise UsageError(f"num_workers={num_workers} applies to backend='multiprocessing', not 'serial'")
        mode = kwargs.pop("autoreset_mode", SAME_STEP)
        step_timeout = kwargs.pop("step_timeout", None)
        if kwargs:
            raise UsageError(f"backend 'serial' takes no options {sorted(kwargs)} (only step_timeout)")
        return Serial(env_creator, num_envs, batch_size=batch_size, seed=seed, autoreset_mode=mode,
                      step_timeout=step_timeout)
    if backend == "multiprocessing":
        return Multiprocessing(env_creator, num_envs, num_workers=num_workers, batch_size=batch_size, seed=seed,
                               **kwargs)
    if backend == "numba":
        try:
            from packrl.vector.numba_backend import make_numba
        except ImportError as err:
            raise UsageError(f"backend 'numba' is not available: {err}") from None
        if num_workers is not None or batch_size is not None:
            raise UsageError("backend 'numba' steps every copy in one call: num_workers and batch_size do not apply")
        if kwargs.pop("halves", False):
            return NumbaHalves(env_creator, num_envs, seed=seed, **kwargs)
        return make_numba(env_creator, num_envs, seed=seed, **kwargs)
    if backend == "ray":
        try:
            from packrl.vector.ray_backend import RayVectorEnv
        except ImportError as err:
            raise UsageError(f"backend 'ray' needs Ray (pip install ray): {err}") from None
        return RayVectorEnv(env_creator, num_envs, num_workers=num_workers, batch_size=batch_size, seed=seed,
                            **kwargs)
    raise UsageError(f"unknown backend {backend!r}; choose one of {BACKENDS}")


def _require_creator(env_creator: Any, backend: str) -> None:
    """Every backend but numba (which also takes a packrl env name) calls ``env_creator()`` once per copy."""
    if backend == "numba" or callable(env_creator):
        return
    what = "a callable that returns a new env, called once per copy"
    if isinstance(env_creator, str):
        hint = (f"backend='numba' for the packrl env {env_creator!r}" if env_creator in envs.names()
                else f"lambda: gymnasium.make({env_creator!r})")
        raise UsageError(f"vector.make takes an env creator ({what}), not the string {env_creator!r}; pass {hint}")
    kind = f"{type(env_creator).__module__}.{type(env_creator).__name__}"
    if hasattr(env_creator, "step") and hasattr(env_creator, "reset"):
        raise UsageError(f"vector.make takes an env creator ({what}), not an env instance ({kind}); pass "
                         "lambda: gymnasium.make(id) or a function that builds the env, so each copy is its own env")
    raise UsageError(f"vector.make takes an env creator ({what}); got {kind}")


def _require_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{name} must be an int, got {value!r} ({type(value).__name__})")


__all__ = ["BACKENDS", "DISABLED", "NEXT_STEP", "SAME_STEP", "Batch", "Serial", "VectorEnv", "make"]
