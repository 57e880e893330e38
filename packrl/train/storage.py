"""Rollout storage: every tensor one rollout writes and the update reads, behind one object.

``RolloutStorage`` allocates the buffers on the training device (and, off CPU, their pinned host copies), hands
out each step's views (``views``), writes what the env returns (``store_outcome``, ``store_next``, ``store_reset``)
and what the policy decided (``store_actions``; packrl's decoders sample straight into ``views``), and reads the
rollout back as minibatch tensors (``batch``). The rollout drivers (``packrl/train/rollout.py``,
``packrl/train/overlap.py``) and ``PPO`` use only these methods and the read-only views below
(``obs``, ``rewards``, ...); no one else writes its buffers.

Observations, masks and episode starts have T + 1 slots: each env step writes straight into the slot of the step
that reads it, and slot T (what follows the rollout) moves to slot 0 when the next rollout begins.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from packrl.models.distributions import ActionSpec
from packrl.nativize import torch_dtype

ENV_ARRAYS = ("obs", "mask", "start", "reward", "terminal", "truncation")


class StepViews(NamedTuple):
    """Step ``t``'s slices of storage (of some rows): what the policy step reads and writes. ``value_column`` is
    ``value`` as ``(rows, 1)`` (where step functions write); ``noise``: the step's random draws (None for a user
    decoder); ``choice``: None unless packrl's discrete decoder draws its choices straight into storage (the
    argmax's ``(rows, k)`` view)."""

    obs: torch.Tensor
    start: torch.Tensor
    logprob: torch.Tensor
    value: torch.Tensor
    value_column: torch.Tensor
    noise: Any
    choice: torch.Tensor | None


def action_spec(decoder: Any) -> ActionSpec | None:
    """The decoder's ActionSpec when it is one of packrl's (its actions and draws preallocated), else None."""
    spec = getattr(decoder, "spec", None)
    return spec if isinstance(spec, ActionSpec) else None


def index(actions: Any, idx: Any) -> Any:
    """Rows ``idx`` of actions, a tensor or a dict of them."""
    return {k: v[idx] for k, v in actions.items()} if isinstance(actions, dict) else actions[idx]


class RolloutStorage:
    """``num_steps`` steps of ``num_rows`` rows on ``device``. ``observations``: the env's observation buffer (its
    row shape and dtype); ``decoder``: the policy's (packrl's: actions and draws preallocated in its spec's form, a
    user decoder's actions allocated on the first ``store_actions``); ``staged``: env arrays go through host copies
    (pinned on CUDA) sent to the device, instead of numpy views of storage (CPU)."""

    def __init__(self, observations: np.ndarray, num_steps: int, num_rows: int, device: torch.device,
                 decoder: Any, staged: bool, recurrent: bool = False):
        T, N, self.device, self.num_steps, self.num_rows = num_steps, num_rows, device, num_steps, num_rows
        self.decoder, self.spec, self.recurrent = decoder, action_spec(decoder), recurrent
        self._slots = {
            "obs": torch.zeros((T + 1, N, *observations.shape[1:]), dtype=torch_dtype(observations.dtype), device=device),
            "mask": torch.zeros((T + 1, N), dtype=torch.bool, device=device),
            "start": torch.zeros((T + 1, N), dtype=torch.bool, device=device),  # first step of an episode: reset state
            "reward": torch.zeros((T, N), device=device),
            "terminal": torch.zeros((T, N), dtype=torch.bool, device=device),
            "truncation": torch.zeros((T, N), dtype=torch.bool, device=device),
        }
        # the rollout's (T, rows, ...) views, made once (a slice is a torch op): read-only outside this class
        self.obs, self.masks, self.starts = (self._slots[k][:T] for k in ("obs", "mask", "start"))
        self.rewards, self.terminals, self.truncations = (self._slots[k] for k in ("reward", "terminal", "truncation"))
        self.logprobs = torch.zeros((T, N), device=device)
        self.values = torch.zeros((T, N), device=device)
        self.final_values = torch.zeros((T, N), device=device)
        self.row_indices = torch.arange(N, device=device).expand(T, N)  # each slot's row (a GroupedPolicy's groups)
        self.segment_states: list = []  # recurrent state at the start of each bptt segment
        self._truncated: list = []  # (step, rows, final observations, state) of the rollout's truncations
        self._allocate_actions(staged)
        self._allocate_staging(staged)
        # Per-step views, made once: indexing a tensor costs about as much as the small copies themselves.
        self._views = [self._make_views(t, slice(None)) for t in range(T)]

    def _allocate_actions(self, staged: bool) -> None:
        T, N, dev, spec = self.num_steps, self.num_rows, self.device, self.spec
        self.actions: Any = None
        self._noise: Any = None
        self._action_views: list = []
        self._action_host: list = []  # per step: what env.step receives, when it is a view of storage
        self._actions_pinned: torch.Tensor | None = None
        if spec is None:
            return
        self.actions = spec.empty_actions((T, N), dev)
        self._noise = spec.empty_noise((T, N), dev)
        self._action_views = [index(self.actions, t) for t in range(T)]
        if spec.kind in ("discrete", "multidiscrete"):
            self._actions_pinned = torch.zeros(self.actions.shape, dtype=self.actions.dtype,
                                               pin_memory=dev.type == "cuda") if staged else None
            host = self._actions_pinned if staged else self.actions
            self._action_host = list(host.numpy())  # int64 choices: exactly what to_numpy gives, no copy on CPU

    def _allocate_staging(self, staged: bool) -> None:
        if not staged:
            # On CPU the env's arrays are written through numpy views of the storage (a numpy copy of a
            # few rows costs a fraction of a torch copy_).
            self._staged: dict | None = None
            self._numpy = {k: v.numpy() for k, v in self._slots.items()}
        else:
            # Off CPU the env's arrays are written by numpy into pinned host copies of the storage and sent to the
            # device once per rollout (``send_staged``); the observation, which the next step's policy reads, goes
            # each step (and the episode starts, when a recurrent policy reads them).
            self._staged = {k: torch.zeros(v.shape, dtype=v.dtype, pin_memory=self.device.type == "cuda")
                            for k, v in self._slots.items()}
            self._numpy = {k: v.numpy() for k, v in self._staged.items()}

    def _make_views(self, t: int, rows: slice) -> StepViews:
        value = self.values[t][rows]
        noise = choice = None
        if self._noise is not None:
            noise = tuple(n[t][rows] for n in self._noise) if isinstance(self._noise, tuple) else self._noise[t][rows]
        if self._action_host:
            action = self._action_views[t][rows]
            # the argmax writes (rows, k); a Discrete's (rows,) storage is written through its (rows, 1) view
            choice = action.unsqueeze(-1) if self.spec.kind == "discrete" else action
        return StepViews(self._slots["obs"][t][rows], self._slots["start"][t][rows], self.logprobs[t][rows], value,
                         value.unsqueeze(-1), noise, choice)

    # ------------------------------------------------------------------ read-only views for the update

    @property
    def staged(self) -> bool:
        """Whether env arrays reach the device through host copies (``send_staged``)."""
        return self._staged is not None

    @property
    def next_masks(self) -> torch.Tensor:
        """Which rows act at the step after the rollout (slot T)."""
        return self._slots["mask"][self.num_steps]

    @property
    def draws_choices(self) -> bool:
        """True when packrl's discrete decoder draws each step's choices straight into storage (``views``)."""
        return bool(self._action_host)

    def views(self, t: int, rows: slice | None = None) -> StepViews:
        """Step ``t``'s views of storage (of ``rows``: all by default, made once)."""
        return self._views[t] if rows is None else self._make_views(t, rows)

    def host_array(self, name: str) -> np.ndarray:
        """Env array ``name`` (``ENV_ARRAYS``) of the rollout as numpy: a view of storage on CPU, of its host copy
        when staged."""
        return self._numpy[name][: self.num_steps]

    # ------------------------------------------------------------------ writes

    def begin_rollout(self) -> None:
        """Start a rollout where the previous one (or the reset) left off: slot T moves to slot 0."""
        T = self.num_steps
        for name in ("obs", "mask", "start"):
            self._slots[name][0].copy_(self._slots[name][T])
            if self._staged is not None:
                self._numpy[name][0] = self._numpy[name][T]
        self.segment_states = []
        self._truncated = []

    def draw_noise(self) -> None:
        """Every step's random draws of packrl's decoder at once (none for a user decoder)."""
        if self.spec is not None:
            self.spec.fill_noise(self._noise)

    def store_reset(self, obs: np.ndarray, masks: np.ndarray) -> None:
        """What the first step of the next rollout starts from after an env reset: every row starts an episode."""
        T = self.num_steps
        self._put(T, "obs", obs)
        self._put(T, "mask", masks)
        self._put(T, "start", np.ones(self.num_rows, bool))
        self.send_staged()

    def store_outcome(self, t: int, rewards: np.ndarray, terminals: np.ndarray, truncations: np.ndarray,
                      final_observations: np.ndarray, state: tuple, rows: slice | None = None) -> None:
        """Step ``t``'s rewards and ends (its ``rows``: all by default), and each truncation's final observation,
        with the rows of ``state`` (the state that saw its episode), kept for its bootstrap value."""
        self._put(t, "reward", rewards, rows)
        self._put(t, "terminal", terminals, rows)
        self._put(t, "truncation", truncations, rows)
        if np.count_nonzero(truncations) and (truncated := np.flatnonzero(truncations & ~terminals)).size:
            at = torch.from_numpy(truncated).to(self.device) if state else None
            first = 0 if rows is None else rows.start
            self._truncated.append((t, truncated + first, final_observations[truncated], tuple(s[at] for s in state)))

    def store_next(self, t: int, obs: np.ndarray, masks: np.ndarray, starts: np.ndarray,
                   rows: slice | None = None) -> None:
        """What step ``t + 1`` starts from (observations, masks, episode starts), of ``rows``."""
        self._put(t + 1, "obs", obs, rows)
        self._put(t + 1, "mask", masks, rows)
        self._put(t + 1, "start", starts, rows)

    def store_actions(self, t: int, action: Any) -> None:
        """Step ``t``'s actions of a user decoder (packrl's sample into ``views``); storage made on the first call."""
        if self.actions is None:
            alloc = lambda a: torch.zeros((self.num_steps, *a.shape), dtype=a.dtype, device=self.device)  # noqa: E731
            with torch.inference_mode(False):  # storage is a normal tensor (the rollout steps in inference mode)
                self.actions = {k: alloc(v) for k, v in action.items()} if isinstance(action, dict) else alloc(action)
                self._action_views = [index(self.actions, i) for i in range(self.num_steps)]
        view = self._action_views[t]
        if isinstance(action, dict):
            for k, v in action.items():
                view[k].copy_(v)
        else:
            view.copy_(action)

    def save_segment_state(self, state: tuple) -> None:
        """The recurrent state at the start of a bptt segment (a copy)."""
        self.segment_states.append(tuple(s.clone() for s in state))

    def _put(self, t: int, name: str, array: np.ndarray, rows: slice | None = None) -> None:
        """Write an env array into slot ``t`` of ``name`` (its ``rows``: all by default). Staged: into the host copy;
        the observation (and a recurrent policy's episode starts) is also copied to the device at once, without
        blocking: its host slot is rewritten a whole rollout later, long after the step's action copy synchronised
        the stream."""
        if rows is None:
            self._numpy[name][t] = array
        else:
            self._numpy[name][t][rows] = array
        if self._staged is not None and (name == "obs" or (name == "start" and self.recurrent)):
            if rows is None:
                self._slots[name][t].copy_(self._staged[name][t], non_blocking=True)
            else:
                self._slots[name][t][rows].copy_(self._staged[name][t][rows], non_blocking=True)

    def send_staged(self) -> None:
        """Staged: the env arrays the rollout wrote on the host (rewards, ends, masks) to the device, one copy each."""
        if self._staged is not None:
            for name, host in self._staged.items():
                if name != "obs":
                    self._slots[name].copy_(host, non_blocking=True)

    # ------------------------------------------------------------------ actions to the env

    def queue_actions(self, t: int, rows: slice | None = None) -> None:
        """Staged: start copying step ``t``'s choices (of ``rows``) to the host, without waiting."""
        if self._actions_pinned is not None:
            if rows is None:
                self._actions_pinned[t].copy_(self._action_views[t], non_blocking=True)
            else:
                self._actions_pinned[t][rows].copy_(self._action_views[t][rows], non_blocking=True)

    def host_actions(self, t: int, rows: slice | None = None) -> np.ndarray:
        """Step ``t``'s drawn choices (of ``rows``) as ``env.step`` takes them (after ``queue_actions`` completed)."""
        return self._action_host[t] if rows is None else self._action_host[t][rows]

    def env_actions(self, t: int) -> Any:
        """Step ``t``'s actions as ``env.step`` takes them: a view of storage on CPU, one device-to-host copy on CUDA."""
        if not self._action_host:
            return self.decoder.to_numpy(self._action_views[t])
        if self._actions_pinned is not None:
            self.queue_actions(t)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
        return self._action_host[t]

    # ------------------------------------------------------------------ reads

    def bootstrap_values(self, value_of: Callable[..., torch.Tensor], state: tuple) -> torch.Tensor:
        """V(observation after the rollout) of every row, returned, and V(final observation) of each truncation of
        the rollout written into ``final_values``, from one ``value_of(x, state, starts, rows)`` call (``rows``: the
        row each of ``x``'s is). A truncated row's final value is read with the state that saw its episode (the
        state after the step that ended it)."""
        T, N = self.num_steps, self.num_rows
        x, done, rows = self._slots["obs"][T], self._slots["start"][T], self.row_indices[0]
        if self._truncated:
            finals = torch.as_tensor(np.concatenate([f for _, _, f, _ in self._truncated])).to(self.device)
            x = torch.cat([x, finals.reshape(-1, *x.shape[1:]).to(x.dtype)])
            done = torch.cat([done, torch.zeros(finals.shape[0], dtype=torch.bool, device=self.device)])
            state = tuple(torch.cat([s, *(snap[i] for _, _, _, snap in self._truncated)]) for i, s in enumerate(state))
            truncated_rows = torch.from_numpy(np.concatenate([r for _, r, _, _ in self._truncated])).to(self.device)
            rows = torch.cat([rows, truncated_rows.to(rows.dtype)])
        values = value_of(x, state, done, rows).float().reshape(-1)
        self.final_values.zero_()
        if self._truncated:
            steps = np.concatenate([np.full(len(r), t) for t, r, _, _ in self._truncated])
            self.final_values[torch.from_numpy(steps).to(self.device), truncated_rows] = values[N:]
        return values[:N]

    @staticmethod
    def segments(x: torch.Tensor, horizon: int) -> torch.Tensor:
        """(T, N, ...) -> (segments, horizon, ...): each row's rollout cut into bptt windows."""
        T, N, L = x.shape[0], x.shape[1], horizon
        return x.reshape(T // L, L, N, *x.shape[2:]).transpose(1, 2).reshape(T // L * N, L, *x.shape[2:])

    def batch(self, train_masks: torch.Tensor, horizon: int) -> dict[str, Any]:
        """The rollout as (segment, time, ...) tensors (``segments``), with the recurrent state at the start of
        each segment. Rows left out of training (not ``train_masks``) hold log-prob and value 0, so nothing they
        carry reaches a loss."""
        cut = lambda x: self.segments(x, horizon)  # noqa: E731
        actions = self.actions
        return {
            "obs": cut(self.obs), "masks": cut(train_masks), "starts": cut(self.starts),
            "logprobs": cut(torch.where(train_masks, self.logprobs, 0.0)),
            "values": cut(torch.where(train_masks, self.values, 0.0)), "rows": cut(self.row_indices),
            "actions": {k: cut(v) for k, v in actions.items()} if isinstance(actions, dict) else cut(actions),
            "states": tuple(torch.stack(parts).reshape(-1, *parts[0].shape[1:]) for parts in zip(*self.segment_states)),
        }
