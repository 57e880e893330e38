"""The multiprocessing backend: worker processes step blocks of envs into one shared segment.

Split (EnvPool-style): when every env steps at once, the main process would only wait, so by
default it steps an equal share of the envs itself while ``cores - 1`` workers step the rest;
on 2 cores that is one worker and two busy processes, not three on two cores.

Signalling: each worker sleeps on its own semaphore and every finished command posts one shared
``done`` semaphore. A POSIX semaphore post costs no system call when nobody sleeps on it, but waking
a sleeper costs tens of microseconds on each side. So each side first spins on non-blocking ``acquire``
calls, then blocks in the kernel. Spinning adapts (``Spinner``): a spin that fails is skipped
for the next 1, 2, 4, ... 64 waits, so when the cores are shared with other work (more runnable
processes than cores) the waiting process stops burning the time slice the other side needs.
Blocking waits time out every ``POLL_S`` to notice a dead worker (or, in a worker, a dead
parent). The numbers behind these choices: benchmarks/README.md, "vector.py, multiprocessing on 2 shared
cores" and "mp_waits.py".
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from multiprocessing.connection import wait
from typing import Any, Callable

import cloudpickle
import numpy as np

from packrl.emulation.codecs import registrations, restore_registrations
from packrl.errors import UsageError
from packrl.vector.attrs import Request, run_block, run_block_pickled
from packrl.vector.autoreset import SAME_STEP
from packrl.vector.base import Batch, WorkerBackend, check_autoreset, check_step_timeout, plan_buffers
from packrl.vector.runner import EnvFailure, EnvRunner, EnvSpec, build_env, close_envs, raise_close_errors, raised_name
from packrl.vector.serial import _check_batch
from packrl.vector.shared import BufferPlan, Segment, attach_segment

POLL_S = 0.05  # a dead worker is noticed within this (plus the time to read its exit status)
CLOSE_GRACE_S = 1.0  # workers get this long to close their envs before they are terminated
MAIN_SPIN_S = 100e-6  # defaults measured with benchmarks/vector.py --spins on 2 cores (see the module docstring)
WORKER_SPIN_S = 200e-6


WAIT_KINDS = ("at once", "spun", "blocked")  # how a wait for the other side's post ended (Spinner.counts)


class Command(IntEnum):
    NONE = 0
    STEP = 1
    RESET = 2
    CLOSE = 3
    CALL = 4  # run a packrl.vector.attrs.Request (sent on the pipe first) on every env of the worker


class Control(IntEnum):
    """The columns of a worker's row of the shared ``control`` array, written by the main process."""

    COMMAND = 0  # a Command
    HAS_SEED = 1  # RESET: whether SEED holds a seed
    SEED = 2
    MASKED = 3  # RESET: reset only the envs flagged in the shared ``reset_mask`` array


class Status(IntEnum):
    BUSY = 0
    DONE = 1
    DONE_INFO = 2  # done, and the infos follow on the worker's pipe
    FAILED = 3  # an env raised; its EnvFailure (env index, traceback, exception) follows on the pipe


# Plain ints of the same names for the per-step paths (an enum member lookup costs about 1 us).
STEP, RESET, CLOSE, CALL = int(Command.STEP), int(Command.RESET), int(Command.CLOSE), int(Command.CALL)
BUSY, DONE, DONE_INFO, FAILED = int(Status.BUSY), int(Status.DONE), int(Status.DONE_INFO), int(Status.FAILED)


@dataclass(frozen=True)
class WorkerArgs:
    worker_id: int
    first_env: int
    num_envs: int
    creator: bytes  # cloudpickled: lambdas and closures work with spawn and forkserver too
    registrations: tuple  # the main process's register_space builders, by import name (codecs.registrations)
    segment: str
    plan: BufferPlan
    spec: EnvSpec
    spin_s: float
    autoreset_mode: Any = SAME_STEP


class Spinner:
    """Adaptive spinning before a blocking wait.

    A spin only pays when the other side is running on another core and is about to post; when
    the cores are shared (more runnable processes than cores) it burns the time slice the other
    side needs. So a spin that fails (the post did not come) skips spinning for the next 1, 2,
    4, ... up to ``MAX_SKIP`` waits, and one that succeeds restores it.

    ``counts`` (``WAIT_KINDS``): how many waits found the post already there, got it by spinning,
    or went on to block; in shared memory for a worker, so the main process can read them
    (``Multiprocessing.wait_counts``, benchmarks/mp_waits.py)."""

    MAX_SKIP = 64

    def __init__(self, spin_s: float, counts: np.ndarray | None = None):
        self.spin_s = spin_s
        self.skip = 0  # waits left to block without spinning
        self.backoff = 1  # the skip after the next failed spin
        self.counts = np.zeros(len(WAIT_KINDS), np.int64) if counts is None else counts

    def wait(self, sem: Any) -> bool:
        """Take ``sem`` if it is posted now or (when spinning) within ``spin_s``; False: block."""
        if sem.acquire(False):
            self.counts[0] += 1
            return True
        if self.skip:
            self.skip -= 1
        elif self.spin_s > 0:
            clock = time.perf_counter
            deadline = clock() + self.spin_s
            while clock() < deadline:
                if sem.acquire(False):
                    self.backoff = 1
                    self.counts[1] += 1
                    return True
            self.skip = self.backoff
            self.backoff = min(2 * self.backoff, self.MAX_SKIP)
        self.counts[2] += 1
        return False


class Multiprocessing(WorkerBackend):
    """``num_workers`` processes, each stepping ``envs_per_worker`` consecutive envs, and, when
    every env steps at once, the main process stepping the last ``main_envs`` envs itself while
    the workers step theirs (it would otherwise sit idle waiting for them).

    ``recv`` returns the first ``batch_size / envs_per_worker`` workers to finish (envs of a
    batch in increasing order) and ``send`` goes to exactly those; with ``batch_size ==
    num_envs`` (the default) ``reset``/``step`` step them all and return zero-copy views.

    ``main_envs`` (``batch_size == num_envs`` only): ``None`` picks the main process's equal share
    (see ``default_split``); ``0`` keeps every env in a worker (an env that crashes its process
    then cannot take the main process down).

    ``step_timeout`` (seconds, default None: wait for ever): a worker whose step, reset or call
    takes longer is killed and the vector env fails with EnvError naming its envs. It needs every
    env in a worker (``main_envs`` defaults to 0 with it; a main process's env cannot be timed out).

    ``autoreset_mode``: see ``packrl.vector.autoreset``."""

    def __init__(self, env_creator: Callable[[], Any], num_envs: int, num_workers: int | None = None,
                 batch_size: int | None = None, seed: int = 0, context: str | None = None,
                 main_envs: int | None = None, main_spin_s: float = MAIN_SPIN_S,
                 worker_spin_s: float = WORKER_SPIN_S, step_timeout: float | None = None,
                 autoreset_mode: Any = SAME_STEP):
        self.step_timeout = check_step_timeout(step_timeout)
        num_workers, main_envs, per_worker = self._split(num_envs, num_workers, batch_size, main_envs)
        ctx = mp.get_context(context or default_context())
        probe = build_env(env_creator)  # the main process needs the row layout before any worker exists
        spec = EnvSpec.of(probe)
        try:
            mode = check_autoreset(autoreset_mode, spec, "multiprocessing", batch_size, num_envs)
        except UsageError:
            _close_probe(probe)
            raise
        if not main_envs:
            _close_probe(probe)
        control = {"control": ((num_workers, len(Control)), np.int64), "status": ((num_workers,), np.int64),
                   "waits": ((num_workers, len(WAIT_KINDS)), np.int64)}
        plan = plan_buffers(spec, num_envs, control)
        shm = Segment(plan.nbytes)
        arrays = plan.views(shm.buf)
        self._setup(spec, num_envs, batch_size, seed, arrays, mode)
        self.num_workers, self.envs_per_worker, self.main_envs = num_workers, per_worker, main_envs
        self._runner: EnvRunner | None = None
        self.context = ctx.get_start_method()
        self._control, self._status = arrays["control"], arrays["status"]
        self._segment_name = shm.name
        self._spinner = Spinner(main_spin_s)
        self._done = ctx.Semaphore(0)
        self._wake = [ctx.Semaphore(0) for _ in range(num_workers)]
        self._procs, self._conns = [], []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._wake, self._control, shm, self._conns)
        self._start_workers(ctx, env_creator, shm.name, plan, spec, worker_spin_s)
        self._in_flight: set[int] = set(range(num_workers))
        self._sent_at = [float("inf")] * num_workers  # when each worker's command went (step_timeout only)
        self._sent_command = [STEP] * num_workers  # and which, with how many steps each was sent: named if it hangs
        self._worker_steps = [0] * num_workers
        self._batch_workers = self.batch_size // per_worker if main_envs == 0 else num_workers
        self._main_infos: list = []
        self._ready: deque[int] = deque()
        self._owed = 0  # completions seen in the status array whose semaphore post is not taken yet
        self._infos: list = [[] for _ in range(num_workers)]
        self._last: list[int] | None = None
        self._broken: str | None = None
        main_block = [probe] if main_envs else []
        try:
            if main_envs:  # built while the workers build theirs
                self._runner = self._main_runner(env_creator, main_block, spec, arrays)
            self._collect(num_workers)  # every worker built its envs and mapped the segment
        except BaseException:
            self._finalizer()
            for env in main_block:
                env.close()
            self.closed = True
            raise
        shm.unlink()  # every process has it mapped: the name can go, so nothing can leak in /dev/shm
        self._ready.clear()

    def _split(self, num_envs: int, num_workers: int | None, batch_size: int | None,
               main_envs: int | None) -> tuple[int, int, int]:
        """``(num_workers, main_envs, envs per worker)``: the split of ``default_split``, checked against the batch
        size and the step timeout (which needs every env in a worker)."""
        if self.step_timeout is not None:
            if main_envs:
                raise UsageError(f"step_timeout needs every env in a worker, but main_envs={main_envs}: the main "
                                 "process's own envs cannot be timed out (pass main_envs=0 or leave it out)")
            main_envs = 0
        _check_batch(num_envs, None, 1)  # num_envs >= 1 before the split is worked out
        num_workers, main_envs = default_split(num_envs, batch_size, num_workers, main_envs)
        per_worker = (num_envs - main_envs) // num_workers
        if batch_size != num_envs:  # all at once fits any split; a smaller batch is whole workers (main_envs 0)
            _check_batch(num_envs, batch_size, per_worker)
        return num_workers, main_envs, per_worker

    def _start_workers(self, ctx: Any, env_creator: Callable[[], Any], segment: str, plan: Any, spec: EnvSpec,
                       worker_spin_s: float) -> None:
        """One process per worker, each told its envs, the segment and the user's registered leaf types; the main
        process keeps the read end of each worker's pipe (a dead worker reads as EOF)."""
        creator = cloudpickle.dumps(env_creator)
        travelled = registrations()
        for w in range(self.num_workers):
            reader, writer = ctx.Pipe(duplex=True)  # replies come back on it; call() requests go out on it
            args = WorkerArgs(w, w * self.envs_per_worker, self.envs_per_worker, creator, travelled, segment, plan,
                              spec, worker_spin_s, self.autoreset_mode)
            proc = ctx.Process(target=_worker_main, args=(args, self._wake[w], self._done, writer),
                               name=f"packrl-vector-worker-{w}", daemon=True)
            self._procs.append(proc)
            self._conns.append(reader)
            proc.start()
            writer.close()  # only the worker holds the write end: its death reads as EOF here

    def _main_runner(self, env_creator: Callable[[], Any], block: list, spec: EnvSpec, arrays: dict) -> EnvRunner:
        """The main process's own envs (the last ``main_envs``; ``block`` holds the probe env), built while the
        workers build theirs."""
        first = self.num_envs - self.main_envs
        for k in range(1, self.main_envs):
            block.append(build_env(env_creator))
            spec.check(block[-1], first + k)
        return EnvRunner(block, first, arrays, spec, self.autoreset_mode)

    # ------------------------------------------------------------ public protocol

    def wait_counts(self) -> dict[str, dict[str, int]]:
        """How the waits for the other side ended so far, per process ("main", "worker 0", ...):
        the post was there at once, came while spinning, or the process blocked in the kernel
        (a blocking wake-up costs tens of microseconds on each side)."""
        rows = {"main": self._spinner.counts, **{f"worker {w}": self.arrays["waits"][w] for w in range(self.num_workers)}}
        return {who: dict(zip(WAIT_KINDS, (int(c) for c in counts))) for who, counts in rows.items()}

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def shared_names(self) -> list[str]:
        """Names this env created in /dev/shm (the segment, and semaphores under spawn/forkserver);
        all are removed by the time ``close`` returns (the segment right after start-up)."""
        sems = [name for name in map(_semaphore_name, [self._done, *self._wake]) if name]
        return [self._segment_name] + ["sem." + n.lstrip("/") for n in sems]

    def async_reset(self, seed: int | None = None) -> None:
        """Reset every env (env i with ``seed + i``); collect the batches with ``recv``."""
        self._check_usable()
        self._drain()
        seed = self._reset_seed(seed)
        self._started = True
        for w in range(self.num_workers):
            self._command(w, RESET, seed)
        self._last = None
        if self._runner is not None:
            self._main_infos = self._run_main(self._runner.reset, seed)

    def _reset_masked(self, seed: int | None, mask: np.ndarray) -> list:
        """Reset the envs of ``mask``: only the workers holding one get the command."""
        self._drain()
        self.arrays["reset_mask"][:] = mask
        per = self.envs_per_worker
        workers = [w for w in range(self.num_workers) if mask[w * per: (w + 1) * per].any()]
        for w in workers:
            self._command(w, RESET, seed, masked=True)
        main_infos = self._run_main(self._runner.reset, seed, mask) if self._runner is not None else []
        self._collect(len(workers))
        infos = [{} for _ in range(self.num_envs)]
        for w in workers:
            for index, info in self._infos[w]:
                infos[index] = info
            self._infos[w] = []
        for index, info in main_infos:
            infos[index] = info
        self._last = list(range(self.num_workers))  # as after reset(): every worker's envs wait for actions
        return infos

    def recv(self) -> Batch:
        """Wait for the first ``batch_size / envs_per_worker`` workers to finish; their batch."""
        self._check_usable()
        self._check_started()
        if self._last is not None:
            raise UsageError("recv() twice without send(): send the actions of the batch received first")
        workers = self._collect(self._batch_workers)
        if len(workers) > 1:
            workers.sort()
        self._last = workers
        env_ids = self._env_ids(workers)
        infos = [{} for _ in range(len(env_ids))]
        position = {int(e): i for i, e in enumerate(env_ids)} if len(workers) < self.num_workers else None
        for w in workers:
            if self._infos[w]:
                for index, info in self._infos[w]:
                    infos[index if position is None else position[index]] = info
                self._infos[w] = []
        if self._main_infos:
            for index, info in self._main_infos:
                infos[index] = info
            self._main_infos = []
        return self._batch(env_ids, infos)

    def send(self, actions: Any) -> None:
        """Step the envs of the batch last received with ``actions`` (one entry per row)."""
        for w in self._write_batch_actions(actions):
            self._command(w, STEP)
        self._last = None
        if self._runner is not None:  # the workers step theirs meanwhile
            self._main_infos = self._run_main(self._runner.step)

    def call_envs(self, request: Request) -> list:
        """Run ``request`` on every env: the workers' blocks, then the main process's own envs."""
        self._check_usable()
        self._check_idle(self._in_flight)
        per = self.envs_per_worker
        try:  # every request pickled before any is sent: one that cannot travel reaches no worker
            payloads = [pickle.dumps(request.block(w * per, per), protocol=pickle.HIGHEST_PROTOCOL)
                        for w in range(self.num_workers)]
        except Exception as err:  # noqa: BLE001 - pickling may raise any class
            raise UsageError(f"{request.name!r}: the arguments or values must pickle to reach the workers: {err}") from None
        for w in range(self.num_workers):
            try:
                self._conns[w].send_bytes(payloads[w])
            except OSError:
                self._check_workers()
                self._fail(f"worker {w} closed its pipe")
            self._command(w, CALL)
        self._collect(self.num_workers)
        results = []
        for w in range(self.num_workers):
            results += self._infos[w]
            self._infos[w] = []
        if self._runner is not None:
            first = self.num_envs - self.main_envs
            results += run_block(self._runner.envs, first, request.block(first, self.main_envs))
        return results

    def close_extras(self, **kwargs: Any) -> None:
        errors: list = []
        try:
            errors += self._finalizer() or []  # the workers' envs whose close raised, reported by the workers
            if self._runner is not None:
                errors += close_envs(self._runner.envs, self._runner.first)
        finally:  # named semaphores (spawn, forkserver) leave /dev/shm when their last reference goes
            self._done = None
        raise_close_errors(errors)  # after everything is closed and released

    # ------------------------------------------------------------ commands and replies

    def _run_main(self, fn: Callable, *args: Any) -> list:
        """Step or reset the main process's own envs; an env error breaks the vector env."""
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - an env may raise any class: reported with its index
            failure = self._runner.failure()
            self._fail(f"main process (pid {os.getpid()}), env {failure.env_index} raised:\n{failure.text}",
                       **failure.fields)
        except KeyboardInterrupt:  # as in serial: the interrupted env is mid-step, so every later call refuses
            index = self._runner.failure().env_index
            self._broken = f"main process (pid {os.getpid()}), env {index} was interrupted (KeyboardInterrupt)"
            self._broken_fields = {"env_index": index}
            raise

    def _command(self, w: int, command: int, seed: int | None = None, masked: bool = False) -> None:
        row = self._control[w]
        if command == RESET:
            row[Control.HAS_SEED], row[Control.SEED] = seed is not None, 0 if seed is None else seed
            row[Control.MASKED] = masked
        row[Control.COMMAND] = command
        self._status[w] = BUSY
        self._in_flight.add(w)
        if self.step_timeout is not None:
            self._sent_at[w], self._sent_command[w] = time.monotonic(), command
            self._worker_steps[w] += command == STEP
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
        status = self._status.tolist()
        for w in sorted(self._in_flight) if len(self._in_flight) > 1 else list(self._in_flight):
            state = status[w]
            if state == BUSY:
                continue
            self._in_flight.discard(w)
            if state == FAILED:
                failure: EnvFailure = self._read(w)
                self._fail(f"worker {w} (pid {self._procs[w].pid}), env {failure.env_index} raised:\n"
                           f"{failure.text}", worker=w, **failure.fields)
            self._infos[w] = self._read(w) if state == DONE_INFO else []
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
        """One post of the shared ``done`` semaphore: spin (adaptively), then sleep in the kernel."""
        if not self._spinner.wait(self._done):
            while not self._done.acquire(True, POLL_S):
                self._check_workers()
                if self.step_timeout is not None:
                    self._check_hung()

    def _check_hung(self) -> None:
        """Kill the workers whose command has run longer than ``step_timeout``; fail naming their envs."""
        now, status = time.monotonic(), self._status
        hung = sorted(w for w in self._in_flight if status[w] == BUSY and now - self._sent_at[w] > self.step_timeout)
        if not hung:
            return
        for w in hung:
            self._procs[w].kill()
        for w in hung:
            self._procs[w].join()
        per = self.envs_per_worker
        what = "; ".join(f"worker {w} (pid {self._procs[w].pid}, " + (f"env {w * per}" if per == 1 else
                         f"envs {w * per}..{w * per + per - 1}") + ")" for w in hung)
        doing = {STEP: f"step {self._worker_steps[hung[0]]}", RESET: "reset", CALL: "call"}.get(
            self._sent_command[hung[0]], "command")
        self._fail(f"multiprocessing backend: {what} did not finish within step_timeout={self.step_timeout} s and was "
                   f"killed: an env hangs (in its {doing})")

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


def default_split(num_envs: int, batch_size: int | None, num_workers: int | None,
                  main_envs: int | None) -> tuple[int, int]:
    """``(num_workers, main_envs)``, filling in what is ``None``.

    Cores are those this process may run on (``usable_cores``), whatever ``num_envs`` is.
    Every env at once (``batch_size`` None or ``num_envs``): one process per core, the main
    process included (``cores - 1`` workers, at least one), and the main process takes an equal
    share of the envs, rounded so the workers split the rest evenly. Batches: one worker per
    core that divides the envs evenly, and the main process steps none (it runs the policy on one
    batch while the workers step the others)."""
    cores = usable_cores()
    sync = batch_size is None or batch_size == num_envs
    if main_envs is not None and main_envs and not sync:
        raise UsageError(f"main_envs={main_envs} needs batch_size == num_envs: with batches the main "
                             "process runs the policy while the workers step")
    if num_workers is None:
        if sync and main_envs != 0:
            num_workers = max(1, min(cores - 1, num_envs - (main_envs or 0)))
        else:
            num_workers = max(w for w in range(1, min(cores, num_envs) + 1) if num_envs % w == 0)
    num_workers = int(num_workers)
    if num_workers < 1:
        raise UsageError(f"num_workers={num_workers} must be at least 1 (backend='serial' uses none)")
    if main_envs is None:
        main_envs = 0
        if sync:  # m = num_envs (mod num_workers), closest to an equal share, at most that share
            share = num_envs / (num_workers + 1)
            fits = [m for m in range(num_envs % num_workers, num_envs - num_workers + 1, num_workers) if m <= share]
            main_envs = max(fits, default=num_envs % num_workers)  # the smallest share that splits evenly
    main_envs = int(main_envs)
    if not 0 <= main_envs <= num_envs - num_workers or (num_envs - main_envs) % num_workers:
        raise UsageError(f"num_workers={num_workers} must divide the num_envs - main_envs = {num_envs} - "
                             f"{main_envs} envs the workers step (each worker steps at least one)")
    return num_workers, main_envs


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under taskset or a container's
    cpuset), not every core of the machine."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this platform (macOS, Windows)
        return os.cpu_count() or 1


def default_context() -> str:
    """forkserver where it exists (safe with threads, unlike fork), else spawn."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _close_probe(probe: Any) -> None:
    """Close the env built only to learn the row layout (the workers build their own)."""
    try:
        probe.close()
    except Exception as err:  # noqa: BLE001 - a throwaway env
        warnings.warn(f"packrl: closing the layout probe env raised {type(err).__name__}: {err}", RuntimeWarning,
                      stacklevel=3)


def _shutdown(procs: list, wake: list, control: np.ndarray, shm: Any, conns: list) -> list:
    """Stop the workers (politely, then by force), reap them, release the segment. Runs once:
    from close(), garbage collection or interpreter exit. Returns the (env index, error) of the
    workers' envs whose own close raised."""
    shm.unlink()  # normally done once the workers attached; this covers a failed start
    procs[:] = [proc for proc in procs if proc.pid is not None]  # a failed start leaves some unstarted
    for w, proc in enumerate(procs):
        if proc.is_alive():
            control[w, Control.COMMAND] = Command.CLOSE
            wake[w].release()
    deadline = time.monotonic() + CLOSE_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    errors = []
    for conn in conns:
        errors += _closed_report(conn)
        conn.close()
    wake.clear()
    return errors


@dataclass(frozen=True)
class Closed:
    """A worker's last message: its envs whose own close raised, as (env index, error text)."""

    errors: list


def _closed_report(conn: Any) -> list:
    """The errors of a worker's ``Closed`` message, read past any reply left unread on its pipe."""
    try:
        while conn.poll(0):
            message = conn.recv()
            if isinstance(message, Closed):
                return message.errors
    except Exception:  # noqa: BLE001 - EOF (a killed worker sends nothing) or a reply that cannot unpickle here
        pass
    return []


# ---------------------------------------------------------------- worker side

def _worker_main(args: WorkerArgs, wake: Any, done: Any, conn: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle; it closes us
    _die_with_parent()
    # The main process, also under forkserver (where the OS parent is the fork server): its
    # sentinel reads end-of-file once the main process is gone, however it died. A thread waits on
    # it, so the worker goes even while an env blocks in step.
    parent = mp.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_when_gone, args=(parent.sentinel,), name="packrl-watch-main", daemon=True).start()
    memory = attach_segment(args.segment, args.plan.nbytes)
    arrays = args.plan.views(memory)
    control, status, w = arrays["control"], arrays["status"], args.worker_id
    envs: list = []
    try:
        try:
            restore_registrations(args.registrations)  # before the creator: its envs' layouts may need them
            creator = cloudpickle.loads(args.creator)
            for k in range(args.num_envs):
                envs.append(build_env(creator))
                args.spec.check(envs[-1], args.first_env + k)
            runner = EnvRunner(envs, args.first_env, arrays, args.spec, args.autoreset_mode)
        except Exception:  # noqa: BLE001 - an env may raise any class: reported with its index
            _reply(status, w, done, conn, Status.FAILED,
                   EnvFailure(args.first_env + len(envs), traceback.format_exc(), raised_name()))
            return
        _reply(status, w, done, conn, Status.DONE, None)
        spinner = Spinner(args.spin_s, arrays["waits"][w])
        while True:
            _wait(wake, spinner, parent)
            command = int(control[w, Control.COMMAND])
            if command == CLOSE:
                conn.send(Closed(close_envs(envs, args.first_env)))
                return
            if command == CALL:  # a call steps nothing: its errors travel as results and the worker goes on
                _reply(status, w, done, conn, DONE_INFO, run_block_pickled(envs, args.first_env, conn.recv()))
                continue
            try:
                if command == STEP:
                    infos = runner.step()
                else:
                    infos = runner.reset(int(control[w, Control.SEED]) if control[w, Control.HAS_SEED] else None,
                                         arrays["reset_mask"] if control[w, Control.MASKED] else None)
            except Exception:  # noqa: BLE001 - an env may raise any class: reported with its index
                _reply(status, w, done, conn, FAILED, runner.failure())
                continue
            try:
                payload = pickle.dumps(infos, protocol=pickle.HIGHEST_PROTOCOL) if infos else None
            except Exception:  # noqa: BLE001 - pickling may raise any class
                _reply(status, w, done, conn, FAILED, unpicklable_info(infos))
                continue
            _reply(status, w, done, conn, DONE_INFO if payload else DONE, payload)
    finally:  # left here only when the worker stops without a CLOSE (a failed start)
        close_envs(envs, args.first_env)


def unpicklable_info(infos: list) -> EnvFailure:
    """The failure of the first env whose info cannot travel to the main process, naming the info's key (also
    what a Ray actor sends, ``packrl.vector.ray_backend``)."""
    for index, info in infos:
        try:
            pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001 - pickling may raise any class
            return EnvFailure(index, f"its info cannot be sent to the main process (it must pickle): "
                              f"{_unpicklable_key(info)}{type(err).__name__}: {err}", raised_name())
    return EnvFailure(infos[0][0], "its info cannot be sent to the main process (it must pickle)", raised_name())


def _unpicklable_key(info: Any) -> str:
    """``info['key'] holds a module.Class: `` for the first entry of a dict info that does not pickle, else ''."""
    if not isinstance(info, dict):
        return ""
    for key, value in info.items():
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - pickling may raise any class
            return f"info[{key!r}] holds a {type(value).__module__}.{type(value).__qualname__}: "
    return ""


def _reply(status: np.ndarray, w: int, done: Any, conn: Any, state: int, payload: Any) -> None:
    status[w] = state
    done.release()
    # The payload goes after the post: the main process reads it only after taking the post, so
    # a reply larger than the pipe buffer cannot deadlock.
    if state == FAILED:
        conn.send(payload)
    elif payload is not None:
        conn.send_bytes(payload)


def _wait(sem: Any, spinner: "Spinner", parent: Any) -> None:
    if spinner.wait(sem):
        return
    while not sem.acquire(True, 1.0):
        if parent is not None and not parent.is_alive():  # orphaned: the main process died without closing us
            os._exit(0)


def _exit_when_gone(sentinel: int) -> None:
    """Exit this worker once the main process is gone (its sentinel reads end-of-file)."""
    wait([sentinel])
    os._exit(0)


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker if its OS parent dies (even by SIGKILL). Under
    forkserver that parent is the fork server, so ``_wait`` watches the main process too."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _semaphore_name(semaphore: Any) -> str | None:
    """The /dev/shm name of a multiprocessing semaphore (None for none, or one without a name): multiprocessing
    exposes it only on the private ``_semlock``, and ``shared_names`` must list what ``close`` removes."""
    if semaphore is None:
        return None
    return semaphore._semlock.name or None  # noqa: SLF001 - no public accessor for the name (CPython 3.8-3.13)
