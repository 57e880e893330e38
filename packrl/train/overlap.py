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
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from packrl.errors import UsageError

if TYPE_CHECKING:
    from packrl.train.ppo import PPO


class Overlap:
    """The overlapped rollout of ``ppo``: ``run()`` fills its storage as ``PPO.collect``'s loop would."""

    def __init__(self, ppo: "PPO"):
        env = ppo.env
        if not hasattr(env, "halves"):
            raise UsageError("train.overlap steps the envs in two halves: make them with vector.make(..., "
                             "backend='numba', halves=True) (packrl train does this for its Numba envs)")
        if ppo.recurrent:
            raise UsageError("train.overlap runs the policy for half of the rows at a time, which a recurrent "
                             "policy's state does not allow: use an mlp network or overlap = false")
        if ppo._spec is None or not ppo._action_host:
            raise UsageError("train.overlap needs discrete actions (Discrete or MultiDiscrete) and packrl's decoder")
        self.ppo, self.halves, self.rows = ppo, env.halves, env.rows
        T, n, device = ppo.config.num_steps, env.rows[0].stop, ppo.device
        self.views = [[(ppo._slots["obs"][t][r], ppo.logprobs[t][r], ppo._value_columns[t][r], ppo._noise_views[t][r],
                        ppo._choice_views[t][r]) for r in self.rows] for t in range(T)]
        self.actions_host = [[host[r] for r in self.rows] for host in ppo._action_host]
        self.sampler = ppo._spec.step_sampler(n, device)
        self.step_function: Callable | None = None  # the policy's, for one half's rows; PPO.collect makes it
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(), torch.cuda.Event()] if self.cuda else []
        self.pool = None if self.cuda else ThreadPoolExecutor(1, thread_name_prefix="packrl-envs")

    def graph_steps(self) -> list[Callable[[], None]]:
        """The policy's work of every (t, half), in rollout order: what ``PPO`` captures as CUDA graphs."""
        T = self.ppo.config.num_steps
        return [lambda t=t, h=h: self.policy_step(t, h) for t in range(T) for h in (0, 1)]

    def run(self) -> None:
        ppo = self.ppo
        pending: tuple[int, int] | None = None
        for t in range(ppo.config.num_steps):
            ppo.rollout_step = t
            for h in (0, 1):
                job: Future | None = self.pool.submit(self.env_step, *pending) if pending and self.pool else None
                try:
                    self.launch(t, h)
                finally:
                    if job is not None:
                        job.result()
                if pending and job is None:
                    self.env_step(*pending)
                pending = (t, h)
        self.env_step(*pending)

    def launch(self, t: int, h: int) -> None:
        """The policy for half ``h`` at step ``t`` (a graph replay on CUDA), then on CUDA its actions' copy to the
        host, queued, with an event that the env step of this half waits for."""
        ppo = self.ppo
        if ppo._graphs:
            ppo._graphs[2 * t + h].replay()
        else:
            self.policy_step(t, h)
        if ppo._actions_pinned is not None:  # staged on the host (CUDA; PPO.stage_on_host on CPU)
            rows = self.rows[h]
            ppo._actions_pinned[t][rows].copy_(ppo._action_views[t][rows], non_blocking=True)
            if self.cuda:
                self.events[h].record()

    def policy_step(self, t: int, h: int) -> None:
        """``PPO._policy_step`` for the rows of half ``h``: forward, value into storage, sample into storage."""
        obs, logprob, value, noise, choice = self.views[t][h]
        if self.step_function is not None:
            logits = self.step_function(obs, value)
        else:
            logits, values, _ = self.ppo._rollout_forward(obs, (), None)
            value.copy_(values.reshape(value.shape))
        self.ppo._sample_choices(logits, self.sampler, noise, choice, logprob)

    def env_step(self, t: int, h: int) -> None:
        """Step half ``h``'s envs with their actions of step ``t`` and write what they return into storage."""
        ppo, half, rows = self.ppo, self.halves[h], self.rows[h]
        if self.cuda:
            self.events[h].synchronize()
        obs, rewards, terminals, truncations, _ = half.step(self.actions_host[t][h])
        ppo._store_outcome(t, rewards, terminals, truncations, half.final_observations, rows)
        ppo._store_next(t, obs, half.masks, np.logical_or(terminals, truncations), rows)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
