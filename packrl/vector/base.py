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
from packrl.vector.autoreset import DISABLED, check_mode, name_of
from packrl.vector.infos import to_dict
from packrl.vector.runner import EnvSpec
from packrl.vector.shared import BufferPlan

SEND_WITHOUT_RECV = "send() without recv(): call recv() (or reset) to get the batch to act on"


def check_seed(seed: Any, num_envs: int) -> None:
    """A vector seed: env i gets ``seed + i``, so every one of them must be a non-negative int64."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= 2**63 - 1 - int(num_envs):
        raise UsageError(f"seed must be an int in [0, 2**63 - 1 - num_envs] (env i gets seed + i), got {seed!r}")


def check_autoreset(mode: Any, spec: EnvSpec, backend: str, batch_size: int | None, num_envs: int) -> Any:
    """The ``autoreset_mode=`` of a worker backend, checked against its envs and batches."""
    mode = check_mode(mode)
    if mode != SAME_STEP and spec.autoreset:
        raise UsageError(f"autoreset_mode={name_of(mode)}: backend {backend!r} was given envs that reset themselves "
                         "(autoreset = True, e.g. a Numba batched env); they only offer SAME_STEP")
    if mode == DISABLED and batch_size not in (None, num_envs):
        raise UsageError(f"autoreset_mode=DISABLED needs batch_size == num_envs (got batch_size={batch_size}): "
                         "reset(options={'reset_mask': mask}) resets envs while no batch is in flight")
    return mode


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
        "ended": ((num_envs,), np.bool_),  # NEXT_STEP / DISABLED: the env's episode ended at its last step
        "reset_mask": ((num_envs,), np.bool_),  # reset(options={"reset_mask": ...}) on its way to the workers
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

    ``autoreset_mode`` (``make(..., autoreset_mode=)``, also in ``metadata``): SAME_STEP as above,
    NEXT_STEP or DISABLED (gymnasium's semantics; ``packrl.vector.autoreset``).
    """

    metadata = {"autoreset_mode": SAME_STEP}  # per instance: the mode make(autoreset_mode=) chose
    autoreset_mode = SAME_STEP
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
               arrays: dict[str, np.ndarray], autoreset_mode: Any = SAME_STEP) -> None:
        self.autoreset_mode = autoreset_mode
        self.metadata = {**type(self).metadata, "autoreset_mode": autoreset_mode}
        self._ended = arrays.get("ended")
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

    @property
    def ended_envs(self) -> np.ndarray:
        """One flag per env (a copy): its episode ended at its last step and it has not been reset since.
        NEXT_STEP resets those envs at their next step; DISABLED waits for ``reset(options={"reset_mask": ...})``.
        Always false with SAME_STEP (an env is reset on the step its episode ends)."""
        return self._ended.copy()

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
        """Reset every env (env i with ``seed + i``); return ``(observations, infos)``.

        ``options={"reset_mask": mask}`` (one bool per env, as gymnasium's SyncVectorEnv takes): reset
        only the envs of ``mask`` (env i with ``seed + i`` when seeded); the others keep their rows.
        The infos are those of the envs reset. Needed with ``autoreset_mode=DISABLED``."""
        self._require_sync("reset")
        if options is None:
            self.async_reset(seed)
            batch = self.recv()
            return batch.observations, batch.infos
        mask = self._check_reset_options(options)
        if not self._started:
            raise UsageError("reset(options={'reset_mask': ...}) before the first reset(): reset every env first")
        infos = self._reset_masked(self._reset_seed(seed), mask)
        return self.observations, self._infos_out(infos, slice(None))

    def _check_reset_options(self, options: Any) -> np.ndarray:
        if not isinstance(options, dict) or set(options) != {"reset_mask"}:
            keys = sorted(options) if isinstance(options, dict) else type(options).__name__
            raise UsageError(f"vector reset takes options={{'reset_mask': mask}} only, got {keys}")
        mask = options["reset_mask"]
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
            what = (f"{mask.dtype} array of shape {mask.shape}" if isinstance(mask, np.ndarray)
                    else type(mask).__name__)
            raise UsageError(f"options['reset_mask'] must be a numpy bool array of shape ({self.num_envs},) "
                             f"(one flag per env), got a {what}")
        if not mask.any():
            raise UsageError("options['reset_mask'] resets no env: at least one flag must be true")
        return mask

    def _reset_masked(self, seed: int | None, mask: np.ndarray) -> list:
        """Reset the envs of ``mask`` with nothing in flight; one info per env (empty for the others)."""
        raise UsageError(f"{type(self).__name__} cannot reset some envs only")

    def _check_not_ended(self, env_ids: np.ndarray) -> None:
        """DISABLED: refuse to step an env whose episode ended and was not reset (before any env steps)."""
        if self.autoreset_mode == DISABLED:
            ended = np.flatnonzero(self._ended[env_ids])
            if len(ended):
                raise UsageError(f"env {int(env_ids[ended[0]])}'s episode ended at its last step and autoreset_mode "
                                 "is DISABLED: reset it with reset(options={'reset_mask': mask}) before stepping it")

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
        if self.agents_per_env != 1 or self.autoreset_mode != SAME_STEP:  # ends per row, or no final_obs: infos as they are
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
        self._check_not_ended(env_ids)
        self._actions.write(actions, self._rows(env_ids), env_ids)
        return workers
