"""The ray backend: one Ray actor per worker steps a block of envs; this process keeps the arrays.

Each actor holds an ``EnvRunner`` over its own local arrays (the rows of its block only), so it
can live on any machine of the cluster. ``send`` hands each actor its rows of the checked
actions as numpy arrays; the actor steps and returns its rows (observations, rewards, flags,
masks, and the final-observation rows that changed), which ``recv`` copies once into the full
arrays (large replies are read zero-copy from Ray's object store). Async batches are the
actors' reply futures, taken oldest first with ``ray.wait``.

A lost actor (its process killed, crashed or taken by ``ray.kill``) is replaced, up to ``max_restarts`` times per
worker: a new actor builds the block's envs and resets them, and the step that was in flight reports the cut
episodes as truncated (see ``RayVectorEnv``). Actors import the known env namespace modules the driver has
imported (``packrl.env_ids.loaded_namespaces``), so MiniGrid/BabyAI ids resolve in them as in the driver.
"""
from __future__ import annotations

import os
import pickle
import socket
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium
import numpy as np
import ray
from ray.exceptions import RayActorError, RayError, WorkerCrashedError

from packrl.emulation.codecs import registrations, restore_registrations
from packrl.env_ids import import_namespaces, loaded_namespaces, namespaces_named_in
from packrl.errors import EnvError, UsageError
from packrl.vector.attrs import Request, run_block_pickled
from packrl.vector.base import Batch, WorkerBackend, check_step_timeout, plan_buffers
from packrl.vector.multiprocessing import unpicklable_info
from packrl.vector.runner import (
    EnvRunner,
    EnvSpec,
    build_env,
    close_envs,
    raise_close_errors,
    raised_name,
    seeds_per_env,
)
from packrl.vector.serial import _check_batch

START_TIMEOUT_S = 300.0  # actors wait for free cluster resources, then build their envs
_OWNED_RUNTIME = {"started": False, "users": 0}
"""Whether packrl started this process's Ray runtime (``ray.init()`` in a vector env), and how many open vector
envs use it: the last one to close stops it. A runtime the caller started is left running."""
CLOSE_GRACE_S = 2.0  # actors get this long to close their envs before they are killed
ACTOR_OPTIONS = {"num_cpus": 1}  # one core per worker: Ray spreads workers over the cluster's cores
MAX_RESTARTS = 3  # per worker, as Ray's own max_restarts: a worker lost more often than this ends the vector env
RESTART_SEED_STRIDE = 2**32  # a restarted block is reset with seed + restarts * stride: streams apart from the first
RESTARTED = "actor_restarted"  # info key of the envs whose actor was lost at this step (its restart number)
CONNECT_TIMEOUT_S = 10.0  # a cluster address must answer a TCP connection this fast (a head's GCS port does at once)
LOST = (RayActorError, WorkerCrashedError)  # the actor's process is gone (not an env's own exception)


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
                 travelled: tuple = ((), ()), namespaces: tuple = ()):
        self.worker_id, self.first, self.num_envs = worker_id, first_env, num_envs
        self.creator = env_creator
        self.travelled = travelled  # the driver's register_space builders, by import name (codecs.registrations)
        self.namespaces = namespaces  # the known env namespace modules the driver imported (env_ids.NAMESPACES only)
        self.envs: list = []

    def start(self) -> Started | Failure:
        """Build the envs (inside a method, not ``__init__``, so a failing creator comes back as
        a ``Failure`` with the env index rather than as a dead actor)."""
        k = 0
        restore_registrations(self.travelled)  # before the envs: their layouts may need the user's leaf types
        try:
            import_namespaces(self.namespaces)  # an actor does not inherit the driver's `import minigrid`
            for k in range(self.num_envs):
                self.envs.append(self._build())
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
        self.copies = seeds_per_env(self.envs[0])
        self.actions = [name for name in self.arrays if name.startswith("actions")]
        final = self.arrays["final_observations"]
        self.final_bytes = final.view(np.uint8).reshape(len(final), -1)
        self.sent_final = self.final_bytes.copy()  # what the main process holds
        return Started(spec, os.getpid(), ray.util.get_node_ip_address())

    def _build(self) -> Any:
        """One env; a gymnasium id of a namespace packrl knows that is not registered here yet gets its module
        imported and one more try (a creator calling ``gymnasium.make("MiniGrid-...")`` whose driver never
        imported minigrid either)."""
        try:
            return build_env(self.creator)
        except (gymnasium.error.NameNotFound, gymnasium.error.NamespaceNotFound) as err:
            modules = namespaces_named_in(str(err))
            if not modules:
                raise
            import_namespaces(modules)
            return build_env(self.creator)

    def reset(self, seed: int | None, held_final: np.ndarray | None = None) -> Reply | Failure:
        """Reset the block. ``held_final``: the final-observation bytes the main process holds for these rows (a
        restarted actor starts from them, so only rows that change later travel)."""
        if held_final is not None:
            self.final_bytes[...] = held_final
            self.sent_final[...] = held_final
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

    def _reply(self, infos: list) -> Reply | Failure:
        if infos:  # an info that cannot travel is the env's failure, named (Ray would report a dead worker)
            try:
                pickle.dumps(infos, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - pickling may raise any class
                failure = unpicklable_info(infos)
                return Failure(failure.env_index, failure.text, failure.exception)
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
    cores, or ``resources``, ``scheduling_strategy``, ``runtime_env``). ``address``: the cluster ``ray.init``
    joins when this vector env starts Ray (``auto``, ``host:port`` or ``ray://host:port``; refused when Ray is
    already initialized in this process, since it could not apply).

    Lost actors: when a worker's actor dies (its process killed or crashed, ``ray.kill``, its node lost) the
    vector env does not fail. The reply it waited for is replaced: a new actor (same options) builds the block's
    envs and resets them, and that step returns, for each row of the block, ``truncations`` true (rows whose
    agent was alive), ``terminals`` false and reward 0, ``observations`` the new episodes' first observations,
    ``final_observations`` the last observation this process received for the row (the env's true last state is
    lost with the actor, so a learner bootstraps from the last one it saw) and the info ``{"reset_info": ...,
    "actor_restarted": n}`` (n: this worker's restart count). The actions of that step are lost. A lost reset is
    simply redone by the new actor. The restarted block is reset with ``seed + restarts * 2**32`` (mod 2**62),
    or with the seed of the reset that was lost, so a rerun losing the same actor at the same step replays.
    ``restarts`` counts the restarts (``worker_restarts`` per worker); a worker lost more than ``max_restarts``
    times (default 3; 0: never restart) ends the vector env with an EnvError naming the worker and its envs. An
    actor lost during ``call``/``get_attr``/``set_attr``/``render`` is not restarted (the call fails). An env
    that raises or hangs is not a lost actor: it ends the vector env as before."""

    def __init__(self, env_creator: Callable[[], Any], num_envs: int, num_workers: int | None = None,
                 batch_size: int | None = None, seed: int = 0, actor_options: dict | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, step_timeout: float | None = None,
                 reset_timeout: float | None = None, max_restarts: int = MAX_RESTARTS, address: str | None = None):
        if num_workers is not None:  # refuse a bad split before starting or joining a cluster
            _split(num_envs, int(num_workers), batch_size)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, (int, np.integer)) or max_restarts < 0:
            raise UsageError(f"max_restarts must be an int >= 0 (restarts of a lost actor, per worker), got "
                             f"{max_restarts!r}")
        self.max_restarts = int(max_restarts)
        check_address(address)
        self.step_timeout = check_step_timeout(step_timeout)
        try:
            self.reset_timeout = check_step_timeout(reset_timeout)
        except UsageError:
            raise UsageError(f"reset_timeout must be a positive number of seconds (or None), got {reset_timeout!r}") \
                from None
        self._resetting: set[int] = set()  # workers whose reply in flight is a reset's (waited up to reset_timeout)
        if not ray.is_initialized():
            _init(address)
            _OWNED_RUNTIME["started"] = True
        elif address is not None:
            raise UsageError(f"address={address!r}: Ray is already initialized in this process (at "
                             f"{ray.get_runtime_context().gcs_address}); address applies only when the vector env "
                             "starts Ray: leave it out, or call ray.init(address=...) yourself")
        self._uses_runtime = _OWNED_RUNTIME["started"]
        if self._uses_runtime:
            _OWNED_RUNTIME["users"] += 1
        num_workers = default_workers(num_envs) if num_workers is None else int(num_workers)
        per_worker = _split(num_envs, num_workers, batch_size)
        self.num_workers, self.envs_per_worker = num_workers, per_worker
        options = {**ACTOR_OPTIONS, **(actor_options or {})}
        self._options, self._start_timeout_s = options, start_timeout_s
        self._actor_class = ray.remote(RayWorker).options(**options)
        # Kept for restarts: the creator pickled once (not once per actor), registrations and namespaces by name.
        self._creator = ray.put(env_creator)
        self._travelled, self._namespaces = registrations(), loaded_namespaces()
        self.worker_restarts = [0] * num_workers
        self._reset_seed_sent: int | None = None  # the seed of the reset in flight (a lost reset is redone with it)
        self._actors: list = []
        self._finalizer = weakref.finalize(self, _shutdown, self._actors)
        try:
            for w in range(num_workers):
                self._actors.append(self._new_actor(w))
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
        """The actor handles (empty once closed); a restarted worker's entry is its new actor."""
        return list(self._actors)

    @property
    def restarts(self) -> int:
        """How many lost actors were replaced since this vector env was made (all workers)."""
        return sum(self.worker_restarts)

    def async_reset(self, seed: int | None = None) -> None:
        """Reset every env (env i with ``seed + i``); collect the batches with ``recv``."""
        self._check_usable()
        self._drain()
        seed = self._reset_seed(seed)
        self._reset_seed_sent = seed
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
            reply = self._get(w, self._in_flight.pop(w), restart=True)
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

    def call_envs(self, request: Request) -> list:
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

    def _get(self, w: int, future: Any, restart: bool = False) -> Reply:
        """Worker ``w``'s reply; with ``restart``, a lost actor is replaced and the reply is the new one's."""
        try:
            reply = ray.get(future)
        except LOST as err:
            if not restart:
                self._fail(f"ray worker {w} (envs {self._span(w)}) died: {type(err).__name__}: {err}")
            return self._restart(w, err)
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
                       f"within {name}={timeout} s and were killed: an env hangs (in its "
                       f"{'reset' if resetting else 'step'})")
        return sorted(workers_of[ref] for ref in ready)

    def _drain(self) -> None:
        """Wait for every reply in flight and drop it (before a reset); failures still raise, and a lost actor
        is replaced (the reset that follows resets its envs)."""
        if self._in_flight:
            self._wait_ready(len(self._in_flight))
        for w, future in list(self._in_flight.items()):
            del self._in_flight[w]
            try:
                ray.get(future)
            except LOST as err:
                self._replace(w, err)
                continue
            except RayError:
                pass
            self._get(w, future)
        self._last = None

    # ------------------------------------------------------------ lost actors

    def _new_actor(self, w: int) -> Any:
        per = self.envs_per_worker
        return self._actor_class.remote(w, w * per, per, self._creator, self._travelled, self._namespaces)

    def _replace(self, w: int, err: BaseException) -> None:
        """Count the loss of worker ``w``'s actor (refused past ``max_restarts``), start a new actor in its
        place and wait until it has built its envs."""
        lost = self._actors[w]
        if self.worker_restarts[w] >= self.max_restarts:
            self._fail(f"ray worker {w} (envs {self._span(w)}) was lost again ({type(err).__name__}) after "
                       f"{self.worker_restarts[w]} restart(s); max_restarts={self.max_restarts}: "
                       f"{' '.join(str(err).split())[:300]}", worker=w)
        self.worker_restarts[w] += 1
        try:  # it may be alive but unreachable (its node lost): make sure Ray does not bring it back
            ray.kill(lost, no_restart=True)
        except (RayError, ValueError):  # already gone
            pass
        self._actors[w] = actor = self._new_actor(w)
        future = actor.start.remote()
        ready, _ = ray.wait([future], timeout=self._start_timeout_s)
        if not ready:
            self._fail(f"ray worker {w} (envs {self._span(w)}) was lost and its replacement did not start within "
                       f"{self._start_timeout_s:.0f} s; it asks for {self._options} and the cluster has "
                       f"{ray.available_resources()} free", worker=w)
        try:
            started = ray.get(future)
        except RayError as again:
            self._fail(f"ray worker {w} (envs {self._span(w)}) was lost and its replacement could not start: "
                       f"{type(again).__name__}: {again}", worker=w)
        if isinstance(started, Failure):
            self._fail(f"ray worker {w} (restarted), env {started.env_index} failed while starting:\n{started.text}",
                       worker=w, **started.fields)
        self.worker_pids[w], self.worker_nodes[w] = started.pid, started.node

    def _restart(self, w: int, err: BaseException) -> Reply:
        """Worker ``w``'s actor was lost while a reset or a step was in flight: its replacement's reset, and for
        a step the cut episodes reported as truncated (see the class docstring)."""
        cut = w not in self._resetting
        self._replace(w, err)
        rows = self._slices[w]
        last = np.array(self.observations[rows])  # what this process saw last of each row
        held = last if cut else np.array(self.final_observations[rows])
        if cut:
            seed = (self.seed + self.restarts * RESTART_SEED_STRIDE) % 2**62
        else:
            seed = self._reset_seed_sent
        future = self._actors[w].reset.remote(seed, held.view(np.uint8).reshape(len(held), -1))
        ready, _ = ray.wait([future], timeout=self.reset_timeout)
        if not ready:
            ray.kill(self._actors[w], no_restart=True)
            self._fail(f"ray worker {w} (envs {self._span(w)}) was restarted and its reset did not finish within "
                       f"reset_timeout={self.reset_timeout} s and was killed", worker=w)
        reply = self._get(w, future)  # lost again this soon: fail rather than loop
        if not cut:
            return reply
        alive = np.array(self.masks[rows])
        reset_infos, first = dict(reply.infos), w * self.envs_per_worker  # the runner lists non-empty infos only
        infos = [(e, {"reset_info": reset_infos.get(e, {}), RESTARTED: self.worker_restarts[w]})
                 for e in range(first, first + self.envs_per_worker)]
        changed = np.arange(len(last))  # every row's final observation is now the last one seen
        return Reply(reply.observations, np.zeros_like(reply.rewards), np.zeros_like(reply.terminals), alive,
                     reply.masks, changed, last, infos)

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


def check_address(address: Any) -> str | None:
    """A Ray cluster address: None, ``auto``, ``local``, ``host:port`` or ``ray://host:port`` (port 1-65535)."""
    if address is None:
        return None
    if not isinstance(address, str) or not _address_ok(address):
        raise UsageError(f"address must be auto, local, host:port or ray://host:port (port 1-65535), got "
                         f"{address!r}")
    return address


def _address_ok(address: str) -> bool:
    if address in ("auto", "local"):
        return True
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return bool(host) and not any(c.isspace() or c in "/@" for c in host) and port.isdigit() \
        and 1 <= int(port) <= 65535


def _init(address: str | None) -> None:
    """``ray.init`` (joining ``address`` when given); a cluster that cannot be joined is one EnvError line. A
    ``host:port`` is probed first: Ray itself retries an address where nothing listens for ever."""
    if address is None:
        ray.init()
        return
    if address not in ("auto", "local"):
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            grpc = _speaks_grpc(host, int(port))
        except OSError as err:
            within = "" if isinstance(err, ConnectionRefusedError) else f" within {CONNECT_TIMEOUT_S:.0f} s"
            raise EnvError(f"cannot join the Ray cluster at address={address!r}: nothing answers at {host}:{port}"
                           f"{within} ({err.strerror or type(err).__name__}); start it "
                           "with `ray start --head` (docs/multinode.md)") from None
        if not grpc:  # Ray would retry it for ever, printing its C++ client's warnings every few seconds
            raise EnvError(f"cannot join the Ray cluster at address={address!r}: something answers at {host}:{port} "
                           "but it is not a Ray cluster (it does not speak gRPC, as a Ray head's GCS port does); "
                           "give the address `ray start --head` printed (docs/multinode.md)")
    try:
        ray.init(address=address)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as err:
        ray.shutdown()
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise EnvError(f"cannot join the Ray cluster at address={address!r}: {first}") from None


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def _speaks_grpc(host: str, port: int) -> bool:
    """Whether ``host:port`` answers HTTP/2's connection preface with a SETTINGS frame, as every gRPC server (a
    Ray head's GCS, a Ray Client server) must; OSError when nothing accepts the connection."""
    with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as connection:
        connection.sendall(HTTP2_PREFACE)
        head = b""
        try:
            while len(head) < 9:
                chunk = connection.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except OSError:  # a timeout or a reset: no HTTP/2 server
            return False
    return len(head) == 9 and head[3] == 0x04  # the frame type byte: SETTINGS


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
