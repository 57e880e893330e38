"""The serial backend: every env in this process, stepping straight into one set of arrays."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Iterator

from packrl.errors import EnvError, UsageError
from packrl.vector.attrs import Request, run_block
from packrl.vector.autoreset import SAME_STEP
from packrl.vector.base import (
    SEND_WITHOUT_RECV,
    Batch,
    VectorEnv,
    check_autoreset,
    check_step_timeout,
    plan_buffers,
)
from packrl.vector.runner import EnvFailure, EnvRunner, EnvSpec, build_env


class Serial(VectorEnv):
    """``num_envs`` envs stepped one after the other in this process.

    With ``batch_size < num_envs`` the envs form fixed batches (0..B-1, B..2B-1, ...) that
    ``recv`` hands out in turn; ``send`` steps the batch last received. ``autoreset_mode``:
    see ``packrl.vector.autoreset``."""

    def __init__(self, env_creator: Callable[[], Any], num_envs: int, batch_size: int | None = None, seed: int = 0,
                 autoreset_mode: Any = SAME_STEP, step_timeout: float | None = None):
        self.step_timeout = check_step_timeout(step_timeout)
        self._steps = 0  # vector steps sent, named when one hangs
        envs = [build_env(env_creator)]
        spec = EnvSpec.of(envs[0])
        try:
            for i in range(1, num_envs):
                env = build_env(env_creator)
                envs.append(env)
                spec.check(env, i)
            _check_batch(num_envs, batch_size, 1)
            mode = check_autoreset(autoreset_mode, spec, "serial", batch_size, num_envs)
        except BaseException:
            for env in envs:
                env.close()
            raise
        self._setup(spec, num_envs, batch_size, seed, plan_buffers(spec, num_envs).local(), mode)
        self._runner = EnvRunner(envs, 0, self.arrays, spec, mode)
        self.envs = envs
        self._next = 0  # the batch recv returns next
        self._pending: list = [[] for _ in range(num_envs // self.batch_size)]
        self._sent = True  # reset or send happened; recv may follow

    def async_reset(self, seed: int | None = None) -> None:
        """Reset every env; ``recv`` then returns the batches in turn."""
        self._check_usable()
        infos = self._run(self._runner.reset, self._reset_seed(seed))
        self._started = True
        self._pending = [[] for _ in self._pending]
        for index, info in infos:
            self._pending[index // self.batch_size].append((index, info))
        self._next, self._sent = 0, True

    def recv(self) -> Batch:
        """The next batch: its rows, flags, infos and env ids."""
        self._check_usable()
        self._check_started()
        if not self._sent:
            raise UsageError("recv() twice without send(): send the actions of the batch received first")
        b = self._next
        env_ids = self._all_env_ids[b * self.batch_size: (b + 1) * self.batch_size]
        infos = [{} for _ in range(len(env_ids))]
        for index, info in self._pending[b]:
            infos[index - b * self.batch_size] = info
        self._pending[b] = []
        self._sent = False
        return self._batch(env_ids, infos)

    def send(self, actions: Any) -> None:
        """Step the envs of the batch last received with ``actions`` (one entry per row)."""
        self._check_usable()
        if self._sent:
            raise UsageError(SEND_WITHOUT_RECV)
        b = self._next
        first, count = b * self.batch_size, self.batch_size
        env_ids = self._all_env_ids[first: first + count]
        rows = self._rows(env_ids)
        self._check_not_ended(env_ids)
        self._actions.write(actions, rows, env_ids)
        self._steps += 1
        infos = self._run(self._runner.step, first, first + count)
        self._pending[b] = infos
        self._next = (b + 1) % len(self._pending)
        self._sent = True

    def step(self, actions: Any) -> tuple:
        """``send`` then ``recv`` for the one batch of every env, without the batch bookkeeping:
        the same checks, state and results, and the whole arrays rather than views of them."""
        self._require_sync("step")
        if self._sent:
            raise UsageError(SEND_WITHOUT_RECV)
        self._check_not_ended(self._all_env_ids)
        self._actions.write(actions, slice(None), self._all_env_ids)
        infos = [{} for _ in range(self.num_envs)]
        self._steps += 1
        for index, info in self._run(self._runner.step, 0, self.num_envs):
            infos[index] = info
        return self.observations, self.rewards, self.terminals, self.truncations, self._infos_out(infos, slice(None))

    def _reset_masked(self, seed: int | None, mask: Any) -> list:
        infos = [{} for _ in range(self.num_envs)]
        for index, info in self._run(self._runner.reset, seed, mask):
            infos[index] = info
        self._next, self._sent = 0, False  # as after reset(): the one batch was handed out
        return infos

    def _run(self, fn: Callable, *args: Any) -> list:
        try:
            if self.step_timeout is None or threading.current_thread() is not threading.main_thread():
                return fn(*args)
            with _alarm(self.step_timeout):
                return fn(*args)
        except _Hung:
            index = self._runner.current
            what = "reset" if fn == self._runner.reset else f"step {self._steps}"
            self._broken = (f"serial backend, env {index} did not finish within step_timeout={self.step_timeout} s "
                            f"and was interrupted: an env hangs (in its {what})")
            self._broken_fields = {"env_index": index}
            raise EnvError(self._broken, **self._broken_fields) from None
        except Exception:  # noqa: BLE001 - an env may raise any class: reported with its index
            failure: EnvFailure = self._runner.failure()
            # the env that raised is mid-step: stepping on could hide its episode end, so every later call refuses
            self._broken = f"serial backend, env {failure.env_index} raised:\n{failure.text}"
            self._broken_fields = failure.fields
            raise EnvError(self._broken, **self._broken_fields) from None
        except KeyboardInterrupt:  # Ctrl-C stays Ctrl-C, but the env it stopped is mid-step: refuse from now on
            index = self._runner.failure().env_index
            self._broken = f"serial backend, env {index} was interrupted (KeyboardInterrupt)"
            self._broken_fields = {"env_index": index}
            raise

    def call_envs(self, request: Request) -> list:
        self._check_usable()
        return run_block(self.envs, 0, request)

    def close_extras(self, **kwargs: Any) -> None:
        self._runner.close()


class _Hung(BaseException):
    """Raised by SIGALRM inside an env that ran past ``step_timeout`` (a BaseException: an env's own
    ``except Exception`` does not swallow it)."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise _Hung in this (the main) thread after ``seconds``; the previous SIGALRM handler comes back after."""
    def hung(signum: int, frame: Any) -> None:
        raise _Hung

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _check_batch(num_envs: int, batch_size: int | None, envs_per_worker: int) -> None:
    if num_envs < 1:
        raise UsageError(f"num_envs must be at least 1, got {num_envs}")
    if batch_size is None:
        return
    if not 1 <= batch_size <= num_envs or num_envs % batch_size or batch_size % envs_per_worker:
        raise UsageError(
            f"batch_size={batch_size} must divide num_envs={num_envs} and be a multiple of the "
            f"{envs_per_worker} env(s) each worker steps")
