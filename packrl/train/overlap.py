"""PPO's rollout with the envs and the policy overlapped (``PPOConfig.overlap``, off by default).

The envs come in two halves (``vector.make(..., backend="numba", halves=True)``). Each step t runs the policy for
half 0, then for half 1, and while the policy runs for one half the other half's envs step with the actions the
policy gave them just before (EnvPool's and PufferLib's double buffering):

    policy(t, 0) | env(t-1, 1)  ->  policy(t, 1) | env(t, 0)  ->  policy(t+1, 0) | env(t, 1)  -> ...

On CUDA the policy's kernels (a captured graph per step and half) run on the device while this thread steps the
other half's envs; on CPU the envs step in a worker thread (Numba's kernels release the GIL) while this thread
runs the policy. Every env still steps once per t with the actions of the same weights and the same random draws,
so the transitions are those of the synchronous rollout: same seed, same run, the same storage (checked in
tests/test_overlap.py). What changes is only the order in which the work is done, and the policy's batch: one half
at a time. It pays where an env step costs about as much as a policy step (large batches of envs); for small
ones the handoff costs more than it hides (benchmarks/overlap.py).
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from packrl.errors import UsageError
from packrl.models.grouped import GroupedPolicy
from packrl.train.rollout import PolicyStep
from packrl.train.storage import RolloutStorage, StepViews


class OverlappedRollout:
    """The overlapped rollout over ``storage``: ``run(steps)`` fills it as ``SynchronousRollout.run`` would."""

    def __init__(self, env: Any, storage: RolloutStorage, step: PolicyStep):
        if not hasattr(env, "halves"):
            raise UsageError("train.overlap steps the envs in two halves: make them with vector.make(..., "
                             "backend='numba', halves=True) (packrl train does this for its Numba envs)")
        if step.recurrent:
            raise UsageError("train.overlap runs the policy for half of the rows at a time, which a recurrent "
                             "policy's state does not allow: use an mlp network or overlap = false")
        if isinstance(step.policy, GroupedPolicy):
            raise UsageError("train.overlap runs the policy for half of the rows at a time, and a GroupedPolicy "
                             "(agents with different spaces) reads every row of a copy in one step: leave overlap off")
        if storage.spec is None or not storage.draws_choices:
            raise UsageError("train.overlap needs discrete actions (Discrete or MultiDiscrete) and packrl's decoder")
        self.storage, self.step, self.halves, self.rows = storage, step, env.halves, env.rows
        T, n, device = storage.num_steps, env.rows[0].stop, storage.device
        self.views = [[storage.views(t, r) for r in self.rows] for t in range(T)]
        self.sampler = storage.spec.step_sampler(n, device)
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(), torch.cuda.Event()] if self.cuda else []
        self.pool = None if self.cuda else ThreadPoolExecutor(1, thread_name_prefix="packrl-envs")
        self.rollout_step: int | None = None  # the step run() is at, None outside a rollout
        # the policy's work of every (t, half), in rollout order: what CUDA graphs capture
        self.eager_steps: list[Callable[[], None]] = [partial(self.policy_step, t, h) for t in range(T) for h in (0, 1)]

    def first_views(self) -> StepViews:
        """The views of the first policy call (one half's rows: what ``PolicyStep.prepare`` shapes for)."""
        return self.views[0][0]

    def check(self) -> None:
        """Nothing to refuse per rollout (the halves reset on their own: same-step autoreset)."""

    def run(self, steps: list[Callable[[], None]]) -> None:
        """The rollout, ``steps[2 * t + h]()`` doing the policy work of step t, half h (eager or a graph replay)."""
        pending: tuple[int, int] | None = None
        for t in range(self.storage.num_steps):
            self.rollout_step = t
            for h in (0, 1):
                job: Future | None = self.pool.submit(self.env_step, *pending) if pending and self.pool else None
                try:
                    self.launch(steps[2 * t + h], t, h)
                finally:
                    if job is not None:
                        job.result()
                if pending and job is None:
                    self.env_step(*pending)
                pending = (t, h)
        self.env_step(*pending)
        self.rollout_step = None

    def launch(self, policy_step: Callable[[], None], t: int, h: int) -> None:
        """The policy for half ``h`` at step ``t``, then (staged) its actions' copy to the host, queued, with an
        event on CUDA that the env step of this half waits for."""
        policy_step()
        self.storage.queue_actions(t, self.rows[h])
        if self.cuda:
            self.events[h].record()

    def policy_step(self, t: int, h: int) -> None:
        """``PolicyStep`` for the rows of half ``h``: forward, value into storage, sample into storage."""
        self.step.rows(self.views[t][h], self.sampler)

    def env_step(self, t: int, h: int) -> None:
        """Step half ``h``'s envs with their actions of step ``t`` and write what they return into storage."""
        storage, half, rows = self.storage, self.halves[h], self.rows[h]
        if self.cuda:
            self.events[h].synchronize()
        obs, rewards, terminals, truncations, _ = half.step(storage.host_actions(t, rows))
        storage.store_outcome(t, rewards, terminals, truncations, half.final_observations, (), rows)
        storage.store_next(t, obs, half.masks, np.logical_or(terminals, truncations), rows)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
