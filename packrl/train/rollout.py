"""The rollout's parts: the policy's step over storage (``PolicyStep``) and the synchronous driver that steps every
env after it (``SynchronousRollout``). The overlapped driver (``packrl/train/overlap.py``) is its peer: both use only
``RolloutStorage``'s and ``PolicyStep``'s public methods, and both hand their per-step work to ``PPO.collect`` as a
list of callables, which ``packrl/train/graphs.py`` may replace by CUDA-graph replays.

Every autoreset mode of the env (``env.metadata["autoreset_mode"]``) gives the same transitions: SAME_STEP as it
comes; NEXT_STEP's reset steps (an env's step after its episode ended: its action is ignored) are masked out, so they
are no decision and are transparent to the advantage chain (reward 0, no end), and a truncation bootstraps from the
observation the ending step returned (its final observation); DISABLED: the envs whose episode ended are reset here,
at that step, with ``reset(options={"reset_mask": ...})``, which is same-step autoreset.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from packrl.errors import UsageError
from packrl.train.storage import RolloutStorage, StepViews
from packrl.vector.autoreset import DISABLED, NEXT_STEP, SAME_STEP


def autocast(device: torch.device, bf16: bool) -> Any:
    """bfloat16 autocast for a forward pass with ``bf16``; else nothing (entering a disabled autocast costs
    microseconds on every rollout step). No cast cache: a captured CUDA graph must not hold casts made outside it."""
    if bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


class PolicyStep:
    """The policy's work of one rollout step, written into storage: forward, sample, log-prob and value. With
    packrl's decoder it reads and writes only preallocated tensors and never syncs with the host, so it can be
    captured as a CUDA graph; on CPU it is a few dozen ops (tests/test_ops_per_step.py counts them).
    ``forward_eval``: the policy's (or its compiled form); ``state``: the recurrent state it carries."""

    def __init__(self, policy: nn.Module, storage: RolloutStorage, forward_eval: Callable, bf16: bool):
        self.policy, self.storage, self.forward_eval, self.bf16 = policy, storage, forward_eval, bf16
        self.device = storage.device
        self.recurrent = len(policy.initial_state(1, self.device)) > 0
        spec = storage.spec
        # the spec's step_sampler: a discrete draw without a distribution object
        self.sampler = spec.step_sampler(storage.num_rows, self.device) if storage.draws_choices else None
        self.step_function: Callable | None = None  # the policy's rollout form for the driver's batch (``prepare``)
        self.in_place = False  # the state kept at fixed addresses (CUDA graphs read it there)
        self.state: tuple = ()
        self.reset_state()

    def reset_state(self) -> None:
        """Zero the recurrent state: in place when it is held at fixed addresses, else anew."""
        if self.in_place:
            for s in self.state:
                s.zero_()
        else:
            self.state = self.policy.initial_state(self.storage.num_rows, self.device)

    def hold_state_in_place(self) -> tuple:
        """From here on the state stays at its addresses (as normal tensors); returns a copy of it."""
        self.in_place = True
        with torch.inference_mode(False):  # normal tensors: reset_state zeroes them outside inference mode
            self.state = tuple(s.clone() for s in self.state)
        return tuple(s.clone() for s in self.state)

    def forward(self, x: torch.Tensor, state: Any, done: torch.Tensor | None) -> tuple:
        """``forward_eval`` under bf16 autocast where asked, without entering a context per step when not."""
        if not self.bf16:
            return self.forward_eval(x, state, done)
        with autocast(self.device, True):
            return self.forward_eval(x, state, done)

    def prepare(self, x: torch.Tensor) -> None:
        """The policy's ``step_function`` for batches like ``x``, made anew each rollout (so it reads the parameters
        the policy holds now), where it stands for ``forward``: an eager forward (no compile, no bf16) of a stateless
        policy. None otherwise."""
        self.step_function = None
        if self.forward_eval != self.policy.forward_eval or self.bf16 or self.recurrent:
            return
        step_function = getattr(self.policy, "step_function", None)
        self.step_function = step_function(x) if step_function is not None else None

    def __call__(self, t: int) -> None:
        """Step ``t`` for every row."""
        views = self.storage.views(t)
        if self.step_function is not None:  # stateless: the values go straight into storage
            logits = self.step_function(views.obs, views.value_column)
        else:
            logits, value, state = self.forward(views.obs, self.state, views.start)
            if self.in_place:
                for held, new in zip(self.state, state):
                    held.copy_(new)
            else:
                self.state = state
            views.value.copy_(value if value.ndim == 1 else value.reshape(-1))
        if self.storage.draws_choices:  # packrl's discrete decoder: choices drawn straight into storage
            self.sample_choices(logits, self.sampler, views)
        else:
            self._sample_actions(t, logits, views)

    def rows(self, views: StepViews, sampler: Callable | None) -> None:
        """A stateless step for some rows (``views`` of them, drawn with ``sampler``): the overlapped rollout's."""
        if self.step_function is not None:
            logits = self.step_function(views.obs, views.value_column)
        else:
            logits, values, _ = self.forward(views.obs, (), None)
            views.value_column.copy_(values.reshape(views.value_column.shape))
        self.sample_choices(logits, sampler, views)

    def sample_choices(self, logits: torch.Tensor, sampler: Callable | None, views: StepViews) -> None:
        """Discrete choices and their log-probability drawn into storage: ``sampler`` (the spec's ``step_sampler``)
        where there is one, else the distribution's ``sample_into``."""
        logits = logits if logits.dtype == torch.float32 else logits.float()
        if sampler is not None:
            sampler(logits, views.noise, views.choice, views.logprob)
        else:
            self.storage.spec.distribution(logits).sample_into(views.noise, views.choice, views.logprob)

    def _sample_actions(self, t: int, logits: torch.Tensor, views: StepViews) -> None:
        logits = logits if logits.dtype == torch.float32 else logits.float()
        spec = self.storage.spec
        if spec is None:  # a decoder of the user's own: its distribution draws its own samples
            dist_ = self.policy.decoder.distribution(logits)
            if hasattr(dist_, "sample_with_log_prob"):
                action, logprob = dist_.sample_with_log_prob()
            else:
                action = dist_.sample()
                logprob = dist_.log_prob(action)
        else:
            action, logprob = spec.distribution(logits).sample_with_log_prob(views.noise)
        views.logprob.copy_(logprob)
        self.storage.store_actions(t, action)


def env_rows(env: Any, per_env: np.ndarray) -> np.ndarray:
    """One flag per env as one flag per row (every row of an env shares its env's flag)."""
    per_row = int(getattr(env, "agents_per_env", 1))
    return per_env if per_row == 1 else np.repeat(per_env, per_row)


class SynchronousRollout:
    """Each step, the policy for every row, then every env. ``horizon``: a recurrent policy's bptt window (the
    state at the start of each is saved for the update)."""

    def __init__(self, env: Any, storage: RolloutStorage, step: PolicyStep, horizon: int):
        self.env, self.storage, self.step, self.horizon = env, storage, step, horizon
        self.mode = getattr(env, "metadata", {}).get("autoreset_mode", SAME_STEP)
        self.rollout_step: int | None = None  # the step run() is at, None outside a rollout
        self.eager_steps: list[Callable[[], None]] = [partial(step, t) for t in range(storage.num_steps)]

    def first_views(self) -> StepViews:
        """The views of the first policy call (what ``PolicyStep.prepare`` shapes its step function for)."""
        return self.storage.views(0)

    def check(self) -> None:
        """Refuse an env whose autoreset mode is none of gymnasium's."""
        if self.mode not in (SAME_STEP, NEXT_STEP, DISABLED):
            raise UsageError(f"PPO: the env's autoreset_mode {self.mode!r} is none of gymnasium's SAME_STEP, "
                             "NEXT_STEP or DISABLED")

    def run(self, steps: list[Callable[[], None]]) -> None:
        """The rollout, ``steps[t]()`` doing step t's policy work (eager or a graph replay)."""
        env, storage, mode = self.env, self.storage, self.mode
        for t in range(storage.num_steps):
            self.rollout_step = t  # where an error that stops the rollout left it (session.error_line)
            if self.step.recurrent and t % self.horizon == 0:
                storage.save_segment_state(self.step.state)
            steps[t]()
            if mode == NEXT_STEP:
                resetting = env_rows(env, env.ended_envs)  # these envs reset at this step, ignoring the action
            obs, rewards, terminals, truncations, _ = env.step(storage.env_actions(t))
            terminals, truncations = np.asarray(terminals), np.asarray(truncations)
            storage.store_outcome(t, rewards, terminals, truncations, env.final_observations, self.step.state)
            if mode == SAME_STEP:
                masks, starts = env.masks, np.logical_or(terminals, truncations)
            elif mode == NEXT_STEP:
                # the envs that ended return their final observation: no start, and the next step is a reset
                ended = env_rows(env, env.ended_envs)
                masks, starts = env.masks & ~ended, (np.logical_or(terminals, truncations) & ~ended) | resetting
            else:
                obs, masks, starts = self._reset_ended(obs, terminals, truncations)
            storage.store_next(t, obs, masks, starts)
        self.rollout_step = None

    def _reset_ended(self, obs: np.ndarray, terminals: np.ndarray, truncations: np.ndarray) -> tuple:
        """DISABLED: reset the envs whose episode ended at this step (the truncations' final observations were
        copied before); ``(observations, masks, starts)`` as a same-step autoreset gives them."""
        starts = np.logical_or(terminals, truncations)  # before the reset, which clears the flags' rows
        ended = self.env.ended_envs
        if ended.any():
            obs, _ = self.env.reset(options={"reset_mask": ended})
        return obs, self.env.masks, starts

    def close(self) -> None:
        """Nothing to release (the overlapped driver's peer method)."""
