"""The multiprocessing backend: worker processes step blocks of envs into one shared segment.

Signalling (measured in benchmarks/vector.py): each worker sleeps on its own semaphore and
every finished command posts one shared ``done`` semaphore. A POSIX semaphore post costs no
system call when nobody sleeps on it, and a short spin of non-blocking ``acquire`` calls catches
a reply that is microseconds away without a wake-up; after the spin both sides block in the
kernel, so waiting processes leave the cores to the envs even when workers outnumber cores.
Blocking waits time out every ``POLL_S`` to notice a dead worker (or, in a worker, a dead
parent).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable

import cloudpickle
import numpy as np

from packrl.errors import EmulationError
from packrl.vector.base import Batch, WorkerBackend, plan_buffers
from packrl.vector.runner import EnvRunner, EnvSpec, build_env
from packrl.vector.serial import _check_batch
from packrl.vector.shared import BufferPlan, Segment, attach_segment

POLL_S = 0.05  # a dead worker is noticed within this (plus the time to read its exit status)
CLOSE_GRACE_S = 1.0  # workers get this long to close their envs before they are terminated
MAIN_SPIN_S = 20e-6  # defaults chosen with benchmarks/vector.py --tune on 2 cores
WORKER_SPIN_S = 50e-6


class Command(IntEnum):
    NONE = 0
    STEP = 1
    RESET = 2
    CLOSE = 3


class Status(IntEnum):
    BUSY = 0
    DONE = 1
    DONE_INFO = 2  # done, and the infos follow on the worker's pipe
    FAILED = 3  # an env raised; (env index, traceback) follows on the pipe


@dataclass(frozen=True)
class WorkerArgs:
    worker_id: int
    first_env: int
    num_envs: int
    creator: bytes  # cloudpickled: lambdas and closures work with spawn and forkserver too
    segment: str
    plan: BufferPlan
    spec: EnvSpec
    spin_s: float


class Multiprocessing(WorkerBackend):
    """``num_workers`` processes, each stepping ``num_envs / num_workers`` consecutive envs.

    ``recv`` returns the first ``batch_size / envs_per_worker`` workers to finish (envs of a
    batch in increasing order) and ``send`` goes to exactly those; with ``batch_size ==
    num_envs`` (the default) ``reset``/``step`` step them all and return zero-copy views."""

    def __init__(self, env_creator: Callable[[], Any], num_envs: int, num_workers: int | None = None,
                 batch_size: int | None = None, seed: int = 0, context: str | None = None,
                 main_spin_s: float = MAIN_SPIN_S, worker_spin_s: float = WORKER_SPIN_S):
        num_workers = default_workers(num_envs) if num_workers is None else int(num_workers)
        if num_workers < 1 or num_envs % num_workers:
            raise EmulationError(f"num_workers={num_workers} must divide num_envs={num_envs}")
        per_worker = num_envs // num_workers
        _check_batch(num_envs, batch_size, per_worker)
        ctx = mp.get_context(context or default_context())
        probe = build_env(env_creator)  # the main process needs the row layout before any worker exists
        spec = EnvSpec.of(probe)
        probe.close()
        control = {"control": ((num_workers, 3), np.int64), "status": ((num_workers,), np.int64)}
        plan = plan_buffers(spec, num_envs, control)
        shm = Segment(plan.nbytes)
        arrays = plan.views(shm.buf)
        self._setup(spec, num_envs, batch_size, seed, arrays)
        self.num_workers, self.envs_per_worker = num_workers, per_worker
        self.context = ctx.get_start_method()
        self._control, self._status = arrays["control"], arrays["status"]
        self._segment_name = shm.name
        self._main_spin_s = main_spin_s
        self._done = ctx.Semaphore(0)
        self._wake = [ctx.Semaphore(0) for _ in range(num_workers)]
        creator = cloudpickle.dumps(env_creator)
        self._procs, self._conns = [], []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._wake, self._control, shm, self._conns)
        for w in range(num_workers):
            reader, writer = ctx.Pipe(duplex=False)
            args = WorkerArgs(w, w * per_worker, per_worker, creator, shm.name, plan, spec, worker_spin_s)
            proc = ctx.Process(target=_worker_main, args=(args, self._wake[w], self._done, writer),
                               name=f"packrl-vector-worker-{w}", daemon=True)
            self._procs.append(proc)
            self._conns.append(reader)
            proc.start()
            writer.close()  # only the worker holds the write end: its death reads as EOF here
        self._in_flight: set[int] = set(range(num_workers))
        self._ready: deque[int] = deque()
        self._owed = 0  # completions seen in the status array whose semaphore post is not taken yet
        self._infos: list = [[] for _ in range(num_workers)]
        self._last: list[int] | None = None
        self._broken: str | None = None
        try:
            self._collect(num_workers)  # every worker built its envs and mapped the segment
        except BaseException:
            self._finalizer()
            self.closed = True
            raise
        shm.unlink()  # every process has it mapped: the name can go, so nothing can leak in /dev/shm
        self._ready.clear()

    # ------------------------------------------------------------ public protocol

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def shared_names(self) -> list[str]:
        """Names this env created in /dev/shm (the segment, and semaphores under spawn/forkserver);
        all are removed by the time ``close`` returns (the segment right after start-up)."""
        sems = [s._semlock.name for s in [self._done, *self._wake] if s is not None and s._semlock.name]
        return [self._segment_name] + ["sem." + n.lstrip("/") for n in sems]

    def async_reset(self, seed: int | None = None) -> None:
        """Reset every env (env i with ``seed + i``); collect the batches with ``recv``."""
        self._check_usable()
        self._drain()
        seed = self._reset_seed(seed)
        for w in range(self.num_workers):
            self._command(w, Command.RESET, seed)
        self._last = None

    def recv(self) -> Batch:
        """Wait for the first ``batch_size / envs_per_worker`` workers to finish; their batch."""
        self._check_usable()
        if self._last is not None:
            raise EmulationError("recv() twice without send(): send the actions of the batch received first")
        workers = sorted(self._collect(self.batch_size // self.envs_per_worker))
        self._last = workers
        env_ids = self._env_ids(workers)
        infos = [{} for _ in range(len(env_ids))]
        position = {int(e): i for i, e in enumerate(env_ids)} if len(workers) < self.num_workers else None
        for w in workers:
            for index, info in self._infos[w]:
                infos[index if position is None else position[index]] = info
            self._infos[w] = []
        return self._batch(env_ids, infos)

    def send(self, actions: Any) -> None:
        """Step the envs of the batch last received with ``actions`` (one entry per row)."""
        for w in self._write_batch_actions(actions):
            self._command(w, Command.STEP)
        self._last = None

    def close_extras(self, **kwargs: Any) -> None:
        self._finalizer()
        # Named semaphores (spawn, forkserver) leave /dev/shm when their last reference goes.
        self._done = None

    # ------------------------------------------------------------ commands and replies

    def _command(self, w: int, command: Command, seed: int | None = None) -> None:
        row = self._control[w]
        row[0] = command
        if command == Command.RESET:
            row[1], row[2] = seed is not None, 0 if seed is None else seed
        self._status[w] = Status.BUSY
        self._in_flight.add(w)
        self._wake[w].release()  # also a memory barrier: the worker sees the actions and the command

    def _collect(self, count: int) -> list[int]:
        """Wait until ``count`` workers are ready; pop and return them in the order they were seen."""
        ready = self._ready
        while len(ready) < count:
            self._take_token()
            if self._owed:
                self._owed -= 1
            else:
                self._owed += self._scan() - 1
        return [ready.popleft() for _ in range(count)]

    def _scan(self) -> int:
        """Move finished in-flight workers to the ready queue; raise on a failed one."""
        found = 0
        status = self._status
        for w in sorted(self._in_flight):
            state = status[w]
            if state == Status.BUSY:
                continue
            self._in_flight.discard(w)
            if state == Status.FAILED:
                env_index, text = self._read(w)
                self._fail(f"worker {w} (pid {self._procs[w].pid}), env {env_index} raised:\n{text}")
            self._infos[w] = self._read(w) if state == Status.DONE_INFO else []
            self._ready.append(w)
            found += 1
        return found

    def _read(self, w: int) -> Any:
        try:
            return self._conns[w].recv()
        except (EOFError, OSError):
            self._check_workers()
            self._fail(f"worker {w} closed its pipe while sending a reply")

    def _take_token(self) -> None:
        """One post of the shared ``done`` semaphore: spin briefly, then sleep in the kernel."""
        done = self._done
        if done.acquire(False):
            return
        if self._main_spin_s > 0:
            deadline = time.perf_counter() + self._main_spin_s
            while time.perf_counter() < deadline:
                if done.acquire(False):
                    return
        while not done.acquire(True, POLL_S):
            self._check_workers()

    def _drain(self) -> None:
        """Wait for every command in flight and drop its results (before a reset)."""
        while self._in_flight:
            self._collect(len(self._ready) + 1)
        self._ready.clear()
        self._infos = [[] for _ in range(self.num_workers)]

    def _check_workers(self) -> None:
        for w, proc in enumerate(self._procs):
            code = proc.exitcode
            if code is not None:
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                first = w * self.envs_per_worker
                self._fail(f"worker {w} (pid {proc.pid}, envs {first}..{first + self.envs_per_worker - 1}) {how}")


def default_workers(num_envs: int) -> int:
    """The most workers, up to the number of cores, that split the envs evenly."""
    cores = os.cpu_count() or 1
    return max(w for w in range(1, min(cores, num_envs) + 1) if num_envs % w == 0)


def default_context() -> str:
    """forkserver where it exists (safe with threads, unlike fork), else spawn."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _shutdown(procs: list, wake: list, control: np.ndarray, shm: Any, conns: list) -> None:
    """Stop the workers (politely, then by force), reap them, release the segment. Runs once:
    from close(), garbage collection or interpreter exit."""
    shm.unlink()  # normally done once the workers attached; this covers a failed start
    procs[:] = [proc for proc in procs if proc.pid is not None]  # a failed start leaves some unstarted
    for w, proc in enumerate(procs):
        if proc.is_alive():
            control[w, 0] = Command.CLOSE
            wake[w].release()
    deadline = time.monotonic() + CLOSE_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
    wake.clear()


# ---------------------------------------------------------------- worker side

def _worker_main(args: WorkerArgs, wake: Any, done: Any, conn: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle; it closes us
    _die_with_parent()
    parent = os.getppid()
    memory = attach_segment(args.segment, args.plan.nbytes)
    arrays = args.plan.views(memory)
    control, status, w = arrays["control"], arrays["status"], args.worker_id
    envs: list = []
    try:
        try:
            creator = cloudpickle.loads(args.creator)
            for k in range(args.num_envs):
                envs.append(build_env(creator))
                args.spec.check(envs[-1], args.first_env + k)
            runner = EnvRunner(envs, args.first_env, arrays, args.spec)
        except Exception:
            import traceback

            _reply(status, w, done, conn, Status.FAILED, (args.first_env + len(envs), traceback.format_exc()))
            return
        _reply(status, w, done, conn, Status.DONE, None)
        while True:
            _wait(wake, args.spin_s, parent)
            command = control[w, 0]
            if command == Command.CLOSE:
                return
            try:
                if command == Command.STEP:
                    infos = runner.step()
                else:
                    infos = runner.reset(int(control[w, 2]) if control[w, 1] else None)
                payload = pickle.dumps(infos, protocol=pickle.HIGHEST_PROTOCOL) if infos else None
            except Exception:
                failure = runner.failure()
                _reply(status, w, done, conn, Status.FAILED, (failure.env_index, failure.text))
                continue
            _reply(status, w, done, conn, Status.DONE_INFO if payload else Status.DONE, payload)
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:  # closing must go on; the env's own error is not ours to report
                pass


def _reply(status: np.ndarray, w: int, done: Any, conn: Any, state: Status, payload: Any) -> None:
    status[w] = state
    done.release()
    # The payload goes after the post: the main process reads it only after taking the post, so
    # a reply larger than the pipe buffer cannot deadlock.
    if state == Status.FAILED:
        conn.send(payload)
    elif payload is not None:
        conn.send_bytes(payload)


def _wait(sem: Any, spin_s: float, parent: int) -> None:
    if sem.acquire(False):
        return
    if spin_s > 0:
        deadline = time.perf_counter() + spin_s
        while time.perf_counter() < deadline:
            if sem.acquire(False):
                return
    while not sem.acquire(True, 1.0):
        if os.getppid() != parent:  # orphaned: the main process died without closing us
            os._exit(0)


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker if its parent dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
