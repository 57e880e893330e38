"""The ray backend: one Ray actor per worker steps a block of envs; this process keeps the arrays.

Each actor holds an ``EnvRunner`` over its own local arrays (the rows of its block only), so it
can live on any machine of the cluster. ``send`` hands each actor its rows of the checked
actions as numpy arrays; the actor steps and returns its rows (observations, rewards, flags,
masks, and the final-observation rows that changed), which ``recv`` copies once into the full
arrays (large replies are read zero-copy from Ray's object store). Async batches are the
actors' reply futures, taken oldest first with ``ray.wait``.
"""
from __future__ import annotations

import os
import pickle
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import ray
from ray.exceptions import RayError

from packrl.emulation.codecs import registrations, restore_registrations
from packrl.errors import EnvError, UsageError
from packrl.vector.attrs import Request, run_block_pickled
from packrl.vector.base import Batch, WorkerBackend, check_step_timeout, plan_buffers
from packrl.vector.runner import EnvRunner, EnvSpec, build_env, close_envs, raise_close_errors, raised_name
from packrl.vector.serial import _check_batch

START_TIMEOUT_S = 300.0  # actors wait for free cluster resources, then build their envs
_OWNED_RUNTIME = {"started": False, "users": 0}
"""Whether packrl started this process's Ray runtime (``ray.init()`` in a vector env), and how many open vector
envs use it: the last one to close stops it. A runtime the caller started is left running."""
CLOSE_GRACE_S = 2.0  # actors get this long to close their envs before they are killed
ACTOR_OPTIONS = {"num_cpus": 1}  # one core per worker: Ray spreads workers over the cluster's cores


@dataclass(frozen=True)
class Started:
    """A worker built its envs: their spec and where the actor runs."""

    spec: EnvSpec
    pid: int
    node: str


@dataclass(frozen=True)
class Failure:
    """An env raised in a worker: its global index, the formatted original traceback and the qualified
    class name of what it raised."""

    env_index: int
    text: str
    exception: str = ""

    @property
    def fields(self) -> dict:
        """The ``EnvError`` keyword fields of this failure."""
        return {"env_index": self.env_index, "env_traceback": self.text, "env_exception": self.exception or None}


@dataclass(frozen=True)
class Reply:
    """A worker's rows after a reset or a step. ``changed`` lists the block rows whose final
    observation changed since the last reply (their new bytes in ``final_rows``): the rest of
    ``final_observations`` stays as it was, in the worker and here alike."""

    observations: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    truncations: np.ndarray
    masks: np.ndarray
    changed: np.ndarray
    final_rows: np.ndarray
    infos: list


class RayWorker:
    """The actor: envs ``first_env .. first_env + num_envs - 1`` over local arrays of its rows."""

    def __init__(self, worker_id: int, first_env: int, num_envs: int, env_creator: Callable[[], Any],
                 travelled: tuple = ((), ())):
        self.worker_id, self.first, self.num_envs = worker_id, first_env, num_envs
        self.creator = env_creator
        self.travelled = travelled  # the driver's register_space builders, by import name (codecs.registrations)
        self.envs: list = []

    def start(self) -> Started | Failure:
        """Build the envs (inside a method, not ``__init__``, so a failing creator comes back as
        a ``Failure`` with the env index rather than as a dead actor)."""
        k = 0
        restore_registrations(self.travelled)  # before the envs: their layouts may need the user's leaf types
        try:
            for k in range(self.num_envs):
                self.envs.append(build_env(self.creator))
                if k == 0:
                    spec = EnvSpec.of(self.envs[0])
                spec.check(self.envs[-1], self.first + k)
            self.arrays = plan_buffers(spec, self.num_envs).local()
            # Rows are local (runner first=0); global env indices are first + local index.
            self.runner = EnvRunner(self.envs, 0, self.arrays, spec)
        except Exception:  # noqa: BLE001 - an env may raise any class: reported with its index
            text, exception = traceback.format_exc(), raised_name()
            self.close()
            return Failure(self.first + k, text, exception)
        self.copies = EnvRunner._copies(self.envs[0])
        self.actions = [name for name in self.arrays if name.startswith("actions")]
        final = self.arrays["final_observations"]
        self.final_bytes = final.view(np.uint8).reshape(len(final), -1)
        self.sent_final = self.final_bytes.copy()  # what the main process holds
        return Started(spec, os.getpid(), ray.util.get_node_ip_address())

    def reset(self, seed: int | None) -> Reply | Failure:
        try:
            # Env i gets seed + i * copies; the local runner counts from 0, so shift by this block's first env.
            infos = self.runner.reset(None if seed is None else seed + self.first * self.copies)
        except Exception:  # noqa: BLE001 - an env may raise any class: reported with its index
            return self._failure()
        return self._reply(infos)

    def step(self, actions: dict[str, np.ndarray]) -> Reply | Failure:
        for name in self.actions:
            self.arrays[name][...] = actions[name]
        try:
            infos = self.runner.step()
        except Exception:  # noqa: BLE001 - an env may raise any class: reported with its index
            return self._failure()
        return self._reply(infos)

    def call(self, request: Request) -> bytes:
        """``call``/``get_attr``/``set_attr``/``render`` on this block (pickled here, so a result that
        cannot travel is reported with its env rather than failing the actor's reply)."""
        return run_block_pickled(self.envs, self.first, request)

    def close(self) -> list[tuple[int, str]]:
        """Close every env; (env index, error) of those whose own close raised, for the main process."""
        return close_envs(self.envs, self.first)

    def _reply(self, infos: list) -> Reply:
        # Only changed final-observation rows travel: envs write them on episode ends only,
        # and comparing bytes here is cheaper than shipping the whole block every step.
        changed = np.flatnonzero((self.final_bytes != self.sent_final).any(axis=1))
        self.sent_final[changed] = self.final_bytes[changed]
        a = self.arrays
        return Reply(a["observations"], a["rewards"], a["terminals"], a["truncations"], a["masks"], changed,
                     a["final_observations"][changed], [(self.first + k, info) for k, info in infos])

    def _failure(self) -> Failure:
        failure = self.runner.failure()
        return Failure(self.first + failure.env_index, failure.text, failure.exception)


class RayVectorEnv(WorkerBackend):
    """``num_workers`` Ray actors, each stepping ``num_envs / num_workers`` consecutive envs.

    ``recv`` returns the first ``batch_size / envs_per_worker`` workers to reply (oldest sends
    first; envs of a batch in increasing order) and ``send`` goes to exactly those; with
    ``batch_size == num_envs`` (the default) ``reset``/``step`` step them all and return views of
    this process's arrays. Ray is initialized with ``ray.init()`` if it is not yet (it connects to
    ``RAY_ADDRESS`` or starts a local cluster); a runtime started so is stopped (``ray.shutdown()``) when the
    last vector env using it closes. ``step_timeout`` bounds steps only: a reset (often slower, and slowest
    on a busy machine) waits up to ``reset_timeout`` (default None: as long as it takes). ``actor_options`` go to ``.options()`` of every
    actor (default ``{"num_cpus": 1}``; e.g. ``{"num_cpus": 0.5}`` to fit more workers than
    cores, or ``resources``, ``scheduling_strategy``, ``runtime_env``)."""

    def __init__(self, env_creator: Callable[[], Any], num_envs: int, num_workers: int | None = None,
                 batch_size: int | None = None, seed: int = 0, actor_options: dict | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, step_timeout: float | None = None,
                 reset_timeout: float | None = None):
        if num_workers is not None:  # refuse a bad split before starting or joining a cluster
            _split(num_envs, int(num_workers), batch_size)
        self.step_timeout = check_step_timeout(step_timeout)
        try:
            self.reset_timeout = check_step_timeout(reset_timeout)
        except UsageError:
            raise UsageError(f"reset_timeout must be a positive number of seconds (or None), got {reset_timeout!r}") \
                from None
        self._resetting: set[int] = set()  # workers whose reply in flight is a reset's (waited up to reset_timeout)
        if not ray.is_initialized():
            ray.init()
            _OWNED_RUNTIME["started"] = True
        self._uses_runtime = _OWNED_RUNTIME["started"]
        if self._uses_runtime:
            _OWNED_RUNTIME["users"] += 1
        num_workers = default_workers(num_envs) if num_workers is None else int(num_workers)
        per_worker = _split(num_envs, num_workers, batch_size)
        self.num_workers, self.envs_per_worker = num_workers, per_worker
        options = {**ACTOR_OPTIONS, **(actor_options or {})}
        actor = ray.remote(RayWorker).options(**options)
        creator = ray.put(env_creator)  # pickled once, not once per actor
        travelled = registrations()
        self._actors: list = []
        self._finalizer = weakref.finalize(self, _shutdown, self._actors)
        try:
            for w in range(num_workers):
                self._actors.append(actor.remote(w, w * per_worker, per_worker, creator, travelled))
            started = self._start(start_timeout_s, options)
        except BaseException:
            self._finalizer()
            self._release_runtime()
            raise
        spec = started[0].spec
        self._setup(spec, num_envs, batch_size, seed, plan_buffers(spec, num_envs).local())
        self.worker_pids = [s.pid for s in started]
        self.worker_nodes = [s.node for s in started]
        rows = per_worker * spec.agents_per_env
        self._slices = [slice(w * rows, (w + 1) * rows) for w in range(num_workers)]
        self._action_names = [name for name in self.arrays if name.startswith("actions")]
        self._in_flight: dict[int, Any] = {}  # worker -> reply future, oldest send first
        self._last: list[int] | None = None
        self._broken: str | None = None

    # ------------------------------------------------------------ public protocol

    @property
    def actors(self) -> list:
        """The actor handles (empty once closed)."""
        return list(self._actors)

    def async_reset(self, seed: int | None = None) -> None:
        """Reset every env (env i with ``seed + i``); collect the batches with ``recv``."""
        self._check_usable()
        self._drain()
        seed = self._reset_seed(seed)
        for w, actor in enumerate(self._actors):
            self._in_flight[w] = actor.reset.remote(seed)
        self._resetting = set(self._in_flight)
        self._last = None

    def recv(self) -> Batch:
        """Wait for the first ``batch_size / envs_per_worker`` workers to reply; their batch."""
        self._check_usable()
        if self._last is not None:
            raise UsageError("recv() twice without send(): send the actions of the batch received first")
        need = self.batch_size // self.envs_per_worker
        if len(self._in_flight) < need:
            raise UsageError("recv() without reset: call reset() or async_reset() first")
        workers = self._wait_ready(need)
        infos_by_env = {}
        for w in workers:
            reply = self._get(w, self._in_flight.pop(w))
            self._store(w, reply)
            infos_by_env.update(reply.infos)
        self._last = workers
        env_ids = self._env_ids(workers)
        infos = [infos_by_env.get(int(e), {}) for e in env_ids] if infos_by_env else [{} for _ in env_ids]
        return self._batch(env_ids, infos)

    def send(self, actions: Any) -> None:
        """Step the envs of the batch last received with ``actions`` (one entry per row)."""
        for w in self._write_batch_actions(actions):
            rows = self._slices[w]
            # .remote() serializes the rows now, so the next write to the arrays cannot race it.
            self._in_flight[w] = self._actors[w].step.remote({name: self.arrays[name][rows]
                                                              for name in self._action_names})
            self._resetting.discard(w)
        self._last = None

    def _call_envs(self, request: Request) -> list:
        self._check_usable()
        self._check_idle(self._in_flight)
        per = self.envs_per_worker
        futures = [a.call.remote(request.block(w * per, per)) for w, a in enumerate(self._actors)]
        results = []
        for w, future in enumerate(futures):
            try:
                results += pickle.loads(ray.get(future))
            except RayError as err:
                self._fail(f"ray worker {w} (envs {self._span(w)}) died: {type(err).__name__}: {err}")
        return results

    def close_extras(self, **kwargs: Any) -> None:
        self._in_flight.clear()
        try:
            raise_close_errors(self._finalizer() or [])  # after every actor is gone
        finally:
            self._release_runtime()

    def _release_runtime(self) -> None:
        """Stop the Ray runtime when packrl started it and this was the last vector env using it."""
        if not self._uses_runtime:
            return
        self._uses_runtime = False
        _OWNED_RUNTIME["users"] -= 1
        if _OWNED_RUNTIME["users"] <= 0 and _OWNED_RUNTIME["started"]:
            _OWNED_RUNTIME.update(started=False, users=0)
            if ray.is_initialized():
                ray.shutdown()

    # ------------------------------------------------------------ replies

    def _start(self, timeout_s: float, options: dict) -> list[Started]:
        futures = [a.start.remote() for a in self._actors]
        ready, pending = ray.wait(futures, num_returns=len(futures), timeout=timeout_s)
        if pending:
            pending = set(pending)
            late = [w for w, f in enumerate(futures) if f in pending]
            raise EnvError(f"ray workers {late} did not start within {timeout_s:.0f} s; each asks for {options} "
                           f"and the cluster has {ray.available_resources()} free: lower num_workers or pass "
                           f"actor_options (e.g. {{'num_cpus': 0.5}})")
        started = []
        for w, future in enumerate(futures):
            try:
                result = ray.get(future)
            except RayError as err:
                raise EnvError(f"ray worker {w} (envs {self._span(w)}) could not start: {err}") from None
            if isinstance(result, Failure):
                raise EnvError(f"ray worker {w}, env {result.env_index} failed while starting:\n{result.text}",
                               worker=w, **result.fields)
            started.append(result)
        first = started[0].spec
        for w, s in enumerate(started[1:], 1):
            mine, ref = _key(s.spec), _key(first)
            if mine != ref:
                raise UsageError(f"env {w * self.envs_per_worker} has (num_agents, row shape, row dtype, "
                                 f"action space) = {mine}, env 0 has {ref}; all envs of a vector env must match")
        return started

    def _get(self, w: int, future: Any) -> Reply:
        try:
            reply = ray.get(future)
        except RayError as err:
            self._fail(f"ray worker {w} (envs {self._span(w)}) died: {type(err).__name__}: {err}")
        if isinstance(reply, Failure):
            self._fail(f"ray worker {w} (pid {self.worker_pids[w]} on {self.worker_nodes[w]}), "
                       f"env {reply.env_index} raised:\n{reply.text}", worker=w, **reply.fields)
        return reply

    def _store(self, w: int, reply: Reply) -> None:
        """Copy a worker's rows into the full arrays (the reply's arrays may be read-only views)."""
        rows = self._slices[w]
        self.observations[rows] = reply.observations
        self.rewards[rows] = reply.rewards
        self.terminals[rows] = reply.terminals
        self.truncations[rows] = reply.truncations
        self.masks[rows] = reply.masks
        if len(reply.changed):
            self.final_observations[rows.start + reply.changed] = reply.final_rows

    def _wait_ready(self, need: int) -> list[int]:
        """The first ``need`` workers to reply, in order; with a ``step_timeout``, the workers still
        busy when it runs out are killed and the vector env fails naming their envs."""
        workers_of = {ref: w for w, ref in self._in_flight.items()}
        resetting = any(w in self._resetting for w in self._in_flight)
        name, timeout = ("reset_timeout", self.reset_timeout) if resetting else ("step_timeout", self.step_timeout)
        ready, _ = ray.wait(list(workers_of), num_returns=need, timeout=timeout)
        if len(ready) < need:
            hung = sorted(set(self._in_flight) - {workers_of[ref] for ref in ready})
            for w in hung:
                ray.kill(self._actors[w], no_restart=True)
            self._fail(f"ray worker(s) {hung} (envs {', '.join(self._span(w) for w in hung)}) did not finish "
                       f"within {name}={timeout} s and were killed: an env hangs")
        return sorted(workers_of[ref] for ref in ready)

    def _drain(self) -> None:
        """Wait for every reply in flight and drop it (before a reset); failures still raise."""
        if self._in_flight:
            self._wait_ready(len(self._in_flight))
        for w, future in list(self._in_flight.items()):
            del self._in_flight[w]
            self._get(w, future)
        self._last = None

    def _span(self, w: int) -> str:
        first = w * self.envs_per_worker
        return f"{first}..{first + self.envs_per_worker - 1}"


def _split(num_envs: int, num_workers: int, batch_size: int | None) -> int:
    """Envs per worker; refuse a split that leaves envs over or batches across workers."""
    if num_workers < 1 or num_envs % num_workers:
        raise UsageError(f"num_workers={num_workers} must divide num_envs={num_envs}")
    _check_batch(num_envs, batch_size, num_envs // num_workers)
    return num_envs // num_workers


def default_workers(num_envs: int) -> int:
    """The most workers, up to the cluster's CPUs, that split the envs evenly."""
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    return max(w for w in range(1, min(cpus, num_envs) + 1) if num_envs % w == 0)


def _key(spec: EnvSpec) -> tuple:
    return spec.agents_per_env, spec.row_shape, spec.row_dtype, spec.single_action_space


def _shutdown(actors: list) -> list:
    """Let the actors close their envs (briefly), then kill them. Runs once: from close(),
    garbage collection or interpreter exit (where Ray may already have stopped them). Returns the
    (env index, error) of the envs whose own close raised, as the actors reported them."""
    errors: list = []
    if not actors:
        return errors
    try:
        if ray.is_initialized():
            closing = [a.close.remote() for a in actors]
            ready, _ = ray.wait(closing, num_returns=len(closing), timeout=CLOSE_GRACE_S)
            for future in ready:
                try:
                    errors += ray.get(future) or []
                except RayError:  # an actor that died or was killed reports nothing
                    pass
            for a in actors:
                ray.kill(a, no_restart=True)
    finally:
        actors.clear()
    return errors
