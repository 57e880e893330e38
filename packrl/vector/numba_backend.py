"""backend="numba": many copies of a Numba env stepped by one compiled call, in this process.

The returned env follows packrl's env protocol with ``autoreset = True`` (see
``packrl.envs.numba_env.BatchedNumbaEnv``), so it also serves as the env of one multiprocessing
worker (pass ``threads=1`` there: the workers already fill the cores).
"""
from __future__ import annotations

from typing import Any

from packrl.envs import batched, spec
from packrl.envs.numba_env import BatchedNumbaEnv, NumbaEnv
from packrl.errors import EnvError


def resolve(env: Any) -> NumbaEnv:
    """A NumbaEnv from a NumbaEnv, a registered name, a BatchedNumbaEnv, or a callable returning one of those."""
    if isinstance(env, NumbaEnv):
        return env
    if isinstance(env, str):
        return spec(env)
    if isinstance(env, BatchedNumbaEnv):
        return env.numba_env
    if callable(env):
        made = env()
        if isinstance(made, (NumbaEnv, str, BatchedNumbaEnv)):
            return resolve(made)
        raise EnvError(f"backend 'numba' needs a Numba env; the env creator returned {type(made).__module__}."
                       f"{type(made).__name__} (use backend 'serial' or 'multiprocessing' for other envs)")
    raise EnvError(f"backend 'numba' takes a NumbaEnv, an env name, or a callable returning one; got {type(env).__name__}")


def make_numba(env: Any, num_envs: int, seed: int = 0, threads: int | None = None, **kw: Any) -> BatchedNumbaEnv:
    """``num_envs`` copies of ``env`` in one batched env (copy j seeded with ``seed + j``).
    ``threads``: None picks serial or prange by batch size; 1 forces serial; k > 1 uses k threads.
    ``episode_infos=True`` adds the ended episodes' returns and lengths to ``infos``."""
    return batched(resolve(env), num_envs, seed=seed, threads=threads, **kw)
