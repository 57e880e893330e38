"""What every packrl vector env shares: spaces, the gymnasium interface, batches and actions."""
from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector.utils import batch_space

from packrl.env_protocol import SAME_STEP, Batch
from packrl.errors import EnvError, UsageError
from packrl.vector.actions import ActionWriter, action_arrays
from packrl.vector.attrs import EnvAttributes
from packrl.vector.infos import to_dict
from packrl.vector.runner import EnvSpec
from packrl.vector.shared import BufferPlan

SEND_WITHOUT_RECV = "send() without recv(): call recv() (or reset) to get the batch to act on"


def check_seed(seed: Any, num_envs: int) -> None:
    """A vector seed: env i gets ``seed + i``, so every one of them must be a non-negative int64."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= 2**63 - 1 - int(num_envs):
        raise UsageError(f"seed must be an int in [0, 2**63 - 1 - num_envs] (env i gets seed + i), got {seed!r}")


def check_step_timeout(step_timeout: Any) -> float | None:
    """A worker backend's ``step_timeout``: None (wait for ever) or a positive number of seconds."""
    if step_timeout is None:
        return None
    if isinstance(step_timeout, bool) or not isinstance(step_timeout, (int, float, np.integer, np.floating)) \
            or not 0 < float(step_timeout) < float("inf"):
        raise UsageError(f"step_timeout must be a positive number of seconds (or None), got {step_timeout!r}")
    return float(step_timeout)


def plan_buffers(spec: EnvSpec, num_envs: int, extra: dict | None = None) -> BufferPlan:
    """Observation, episode and action arrays for ``num_envs`` envs, plus any backend arrays."""
    rows = num_envs * spec.agents_per_env
    arrays = {
        "observations": ((rows, *spec.row_shape), spec.row_dtype),
        "final_observations": ((rows, *spec.row_shape), spec.row_dtype),
        "rewards": ((rows,), np.float32),
        "terminals": ((rows,), np.bool_),
        "truncations": ((rows,), np.bool_),
        "masks": ((rows,), np.bool_),
    }
    arrays.update(action_arrays(spec.single_action_space, rows))
    arrays.update(extra or {})
    return BufferPlan.build(arrays)


class VectorEnv(EnvAttributes, gymnasium.vector.VectorEnv):
    """Many envs, one set of arrays with one row per agent (``num_agents = num_envs * agents_per_env``).

    ``reset`` and ``step`` (``batch_size == num_envs``) return zero-copy views of the arrays,
    overwritten by the next call. With ``batch_size < num_envs`` use ``async_reset``, ``recv``
    and ``send``. Episode ends are never hidden: on the step an episode ends, the flags and the
    final reward are set, ``observations`` holds the next episode's first observation and
    ``final_observations`` the ended episode's last one. ``infos`` is a list with one dict per
    env of the batch (empty when the env gave none; the reset info of a same-step autoreset is
    under ``"reset_info"``); ``vector.make(..., infos="dict")`` gives gymnasium's dict of arrays
    with ``_key`` masks instead (``packrl.vector.infos``). ``call``/``get_attr``/``set_attr``/
    ``render`` reach every env (``packrl.vector.attrs``).
    """

    metadata = {"autoreset_mode": SAME_STEP}
    info_format = "list"  # vector.make(infos="dict"): gymnasium's dict of arrays (packrl.vector.infos)

    _broken: str | None = None  # why the env failed; every later call refuses
    _broken_fields: dict = {}  # the EnvError fields of that failure (env_index, worker, env_traceback)

    def _fail(self, message: str, **fields: Any) -> None:
        """Break the vector env: raise EnvError(message, **fields), and refuse every later call."""
        self._broken, self._broken_fields = message, fields
        raise EnvError(message, **fields)

    def close(self, **kwargs: Any) -> None:
        """Close every env and release the workers and shared memory. The vector env is closed
        even when an env's own ``close`` raises (that error is raised after the rest is released)."""
        if self.closed:
            return
        try:
            self.close_extras(**kwargs)
        finally:
            self.closed = True

    def _check_usable(self) -> None:
        if self.closed:
            raise EnvError("the vector env is closed")
        if self._broken is not None:
            raise EnvError(f"the vector env failed earlier and must be closed: {self._broken.splitlines()[0]}",
                           **self._broken_fields)

    def _setup(self, spec: EnvSpec, num_envs: int, batch_size: int | None, seed: int,
               arrays: dict[str, np.ndarray]) -> None:
        self.spec_ = spec
        self.num_envs = num_envs
        self.agents_per_env = spec.agents_per_env
        self.num_agents = num_envs * spec.agents_per_env
        self.batch_size = num_envs if batch_size is None else int(batch_size)
        self.seed = int(seed)
        self.emulated = spec.emulated
        self.possible_agents = spec.possible_agents
        self.single_observation_space = spec.single_observation_space
        self.single_action_space = spec.single_action_space
        self.observation_space = batch_space(spec.single_observation_space, self.num_agents)
        self.action_space = batch_space(spec.single_action_space, self.num_agents)
        self.arrays = arrays
        self.observations = arrays["observations"]
        self.final_observations = arrays["final_observations"]
        self.rewards = arrays["rewards"]
        self.terminals = arrays["terminals"]
        self.truncations = arrays["truncations"]
        self.masks = arrays["masks"]
        self._actions = ActionWriter(spec.single_action_space, arrays, spec.agents_per_env)
        self._all_env_ids = np.arange(num_envs)
        self._seeded = False
        self._started = False  # an async_reset (or reset) has been issued: recv has something to wait for
        self.closed = False

    def _check_started(self) -> None:
        if not self._started:
            raise UsageError("recv() before any reset: call reset() or async_reset() first")

    @property
    def synchronous(self) -> bool:
        return self.batch_size == self.num_envs

    def _reset_seed(self, seed: int | None) -> int | None:
        """``reset()`` without a seed uses ``make``'s seed the first time, then continues the envs' RNGs."""
        if seed is not None:
            check_seed(seed, self.num_envs)
            seed = int(seed)  # gymnasium takes Python ints only
        if seed is None and not self._seeded:
            seed = self.seed
        self._seeded = True
        return seed

    def _require_sync(self, what: str) -> None:
        self._check_usable()
        if not self.synchronous:
            raise UsageError(f"{what}() steps every env at once; with batch_size={self.batch_size} < "
                                 f"num_envs={self.num_envs} use async_reset(), recv() and send()")

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, list]:
        """Reset every env (env i with ``seed + i``); return ``(observations, infos)``."""
        self._require_sync("reset")
        if options is not None:
            raise UsageError("vector reset takes no options")
        self.async_reset(seed)
        batch = self.recv()
        return batch.observations, batch.infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list]:
        """Step every env; return ``(observations, rewards, terminals, truncations, infos)``."""
        self._require_sync("step")
        self.send(actions)
        b = self.recv()
        return b.observations, b.rewards, b.terminals, b.truncations, b.infos

    def _rows(self, env_ids: np.ndarray) -> Any:
        """Rows of a batch of envs: a slice when they are consecutive (views, no copy)."""
        a = self.agents_per_env
        first, count = int(env_ids[0]), len(env_ids)
        if count == self.num_envs:
            return slice(None)
        if env_ids[-1] - first == count - 1 and (count == 1 or bool(np.all(np.diff(env_ids) == 1))):
            return slice(first * a, (first + count) * a)
        return (env_ids[:, None] * a + np.arange(a)).reshape(-1)

    def _batch(self, env_ids: np.ndarray, infos: list) -> Batch:
        rows = self._rows(env_ids)
        return Batch(self.observations[rows], self.rewards[rows], self.terminals[rows], self.truncations[rows],
                     self._infos_out(infos, rows), env_ids, self.masks[rows], self.final_observations[rows])

    def _infos_out(self, infos: list, rows: Any) -> list | dict:
        """The batch's infos in the form ``vector.make(infos=...)`` chose."""
        if self.info_format == "list":
            return infos
        if self.agents_per_env != 1:  # episode ends are per row: infos are added as they are
            return to_dict(infos)
        return to_dict(infos, self.terminals[rows] | self.truncations[rows], self.final_observations[rows])

    def __enter__(self) -> "VectorEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_envs={self.num_envs}, agents_per_env={self.agents_per_env}, "
                f"batch_size={self.batch_size}, observation row {self.spec_.row_shape} {np.dtype(self.spec_.row_dtype)})")


class WorkerBackend(VectorEnv):
    """What the backends with workers share: each worker steps ``envs_per_worker`` consecutive envs,
    and a batch is a set of whole workers (``self._last``: those of the batch last received)."""

    envs_per_worker: int
    num_workers: int
    _last: list[int] | None

    def _env_ids(self, workers: list[int]) -> np.ndarray:
        """The env ids of ``workers``, in worker order."""
        if len(workers) == self.num_workers:
            return self._all_env_ids
        per = self.envs_per_worker
        return np.concatenate([self._all_env_ids[w * per: (w + 1) * per] for w in workers])

    def _write_batch_actions(self, actions: Any) -> list[int]:
        """Check and write the actions of the batch last received (bad actions never reach a worker);
        return its workers."""
        self._check_usable()
        workers = self._last
        if workers is None:
            raise UsageError(SEND_WITHOUT_RECV)
        env_ids = self._env_ids(workers)
        self._actions.write(actions, self._rows(env_ids), env_ids)
        return workers
