"""PPO over any packrl vector env and Policy, read top to bottom like CleanRL's ppo.py.

One iteration: collect ``num_steps`` steps from every row of the vector env into storage on the
training device, compute advantages that know termination from truncation (``advantage.py``), then
``update_epochs`` passes of minibatches over (segment, time) slices with the clipped policy and value
losses. Rows that are masked (dead or absent agents, AEC agents waiting for their turn) contribute
nothing to any loss or statistic. A row that waits for its turn when the rollout ends (AEC) bootstraps
from its own last decision's observation, never from its zero row (``cut_pending_decisions``). With
``torch.distributed`` initialised (``torchrun``), every rank steps its own envs and gradients are averaged
across ranks before each optimizer step.

Steps are agent steps: rows that acted (an AEC env adds one per turn, a Parallel env one per live agent).
Nothing non-finite is trained on: a NaN or infinite reward or observation, loss, gradient or parameter
raises ``NonFiniteError`` naming the first one (env row and leaf, or epoch and minibatch).
"""
from __future__ import annotations

import base64
import contextlib
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numba
import numpy as np
import torch
from torch import nn

from packrl.errors import PackrlError, UsageError
from packrl.hyperparameters import PPOConfig
from packrl.models.distributions import ActionSpec
from packrl.nativize import torch_dtype
from packrl.train.advantage import compute_advantages, cut_pending_decisions
from packrl.train.distributed import (
    all_sum,
    average_gradients,
    broadcast_parameters,
    rank_and_world,
)
from packrl.train.optimizer import adam
from packrl.train.overlap import Overlap
from packrl.train.reward_scaling import CLIP as REWARD_CLIP
from packrl.train.reward_scaling import RewardScaler
from packrl.vector.autoreset import DISABLED, NEXT_STEP, SAME_STEP


class NonFiniteError(PackrlError, FloatingPointError):
    """A NaN or infinity reached training. ``stats`` holds what the iteration had measured when it stopped."""

    def __init__(self, message: str, stats: dict):
        super().__init__(message)
        self.stats = stats


def seed_everything(seed: int) -> None:
    """The one place a run's seed reaches Python's, NumPy's and torch's global generators (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def hold_cuda_to_deterministic_algorithms() -> None:
    """Same seed, same run on CUDA: two gridworld runs of one seed on an H200 gave different checkpoints
    (the suspects: a convolution's weight gradient and gather/index_select backward, summed with atomics).
    Ops with a deterministic CUDA algorithm use it (cuDNN included); one without warns instead of failing.
    cuBLAS needs its workspace setting before its first call, so this runs before the policy moves."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


@dataclass
class EpisodeTracker:
    """Per-row return and length, recorded when a row's episode ends (masked steps add nothing).
    ``agents[row]`` names the agent of each row (``None``: one agent, no per-agent figures)."""

    num_rows: int
    agents: tuple | None = None
    returns: np.ndarray = field(init=False)
    lengths: np.ndarray = field(init=False)
    finished: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.returns = np.zeros(self.num_rows, np.float64)
        self.lengths = np.zeros(self.num_rows, np.int64)

    def record(self, rewards: np.ndarray, ended: np.ndarray, acted: np.ndarray) -> None:
        """A rollout's ``(T, rows)`` rewards, episode ends and acting masks, step by step in order: each row's
        return and length accumulate, and an ended episode is appended to ``finished`` (one kernel call per
        rollout, where a per-step update cost every env step a few numpy calls)."""
        capacity = int(np.count_nonzero(ended))
        out_returns, out_lengths = np.empty(capacity, np.float64), np.empty(capacity, np.int64)
        out_rows = np.empty(capacity, np.int64)
        _record_episodes(rewards, ended, acted, self.returns, self.lengths, out_returns, out_lengths, out_rows)
        self.finished.extend(zip(out_returns.tolist(), out_lengths.tolist(), out_rows.tolist()))

    def pop(self) -> dict[str, float]:
        """The statistics of the episodes ended since the last pop: count, mean return and length, and
        with several agents per env the mean return of each agent (``episode_return/<agent>``)."""
        done, self.finished = self.finished, []
        stats: dict[str, float] = {"episodes": len(done)}
        if done:
            stats["episode_return"] = float(np.mean([r for r, _, _ in done]))
            stats["episode_length"] = float(np.mean([n for _, n, _ in done]))
        if self.agents is not None:
            per_agent: dict[str, list] = {}
            for ret, _, row in done:
                per_agent.setdefault(str(self.agents[row]), []).append(ret)
            stats.update({f"episode_return/{agent}": float(np.mean(r)) for agent, r in per_agent.items()})
        return stats


@numba.njit(cache=True, nogil=True)
def _record_episodes(rewards: np.ndarray, ended: np.ndarray, acted: np.ndarray, returns: np.ndarray,
                     lengths: np.ndarray, out_returns: np.ndarray, out_lengths: np.ndarray, out_rows: np.ndarray) -> None:
    k = 0
    for t in range(rewards.shape[0]):
        for row in range(rewards.shape[1]):
            returns[row] += rewards[t, row]
            lengths[row] += acted[t, row]
            if ended[t, row]:
                out_returns[k], out_lengths[k], out_rows[k] = returns[row], lengths[row], row
                returns[row], lengths[row] = 0.0, 0
                k += 1


def row_agents(vecenv: Any) -> tuple | None:
    """The agent name of every row when each env holds several agents (PettingZoo), else None."""
    per_env = getattr(vecenv, "agents_per_env", 1)
    names = tuple(getattr(vecenv, "possible_agents", ()))
    if per_env <= 1 or len(names) != per_env:
        return None
    return tuple(names[row % per_env] for row in range(vecenv.num_agents))


class PPO:
    """``PPO(vecenv, policy, config).train(total_steps)``; ``collect()`` and ``update()`` are the two halves
    of one iteration. ``vecenv`` follows packrl's vector contract (``reset``, ``step``, ``masks``,
    ``final_observations``); ``policy`` is a ``packrl.models.Policy``."""

    stage_on_host: bool | None = None  # None: off CPU. True stages on CPU too (tests run the CUDA path's logic there)

    def __init__(self, vecenv: Any, policy: nn.Module, config: PPOConfig | None = None):
        self.env, self.config = vecenv, config or PPOConfig()
        cfg = self.config
        self.device = cfg.resolve_device()
        if self.device.type == "cuda":
            hold_cuda_to_deterministic_algorithms()
        self.rank, self.world = rank_and_world()
        torch.manual_seed(cfg.seed)
        self.policy = policy.to(self.device)
        if self.world > 1:
            broadcast_parameters(self.policy)
        self.optimizer = adam(self.policy.parameters(), cfg.learning_rate)
        # compile: the minibatch loss as one graph (policy forward, distribution, losses; its backward compiled
        # with it), which fuses the loss's small ops; the first update pays the compilation. The rollout forward
        # too, except on CPU: at rollout batch sizes a compiled call costs more than the eager ops it replaces
        # (8 Numba CartPoles, 128 steps: 35.7 ms compiled against 28.6 ms eager; 64 envs: 35.7 against 31.7)
        compile_rollout = cfg.compile and self.device.type != "cpu"
        self.forward_eval = torch.compile(policy.forward_eval) if compile_rollout else policy.forward_eval
        self.forward = torch.compile(policy.forward) if cfg.compile else policy.forward
        self.minibatch_loss = torch.compile(self._minibatch_loss) if cfg.compile else self._minibatch_loss
        self.recurrent = len(policy.initial_state(1, self.device)) > 0
        self.horizon = (cfg.bptt_horizon or cfg.num_steps) if self.recurrent else 1
        if cfg.num_steps % self.horizon:
            raise ValueError(f"num_steps={cfg.num_steps} must be a multiple of bptt_horizon={self.horizon}")
        self.num_rows = vecenv.num_agents
        self.global_step = 0  # agent steps (acting rows) summed over ranks
        self.iteration = 0
        self.rollout_step: int | None = None  # the step collect() is at, None outside a rollout
        self.episodes = EpisodeTracker(self.num_rows, row_agents(vecenv))
        self.reward_scaler = RewardScaler(self.num_rows, cfg.gamma) if cfg.normalize_rewards else None
        self._allocate_storage()
        self._overlap = Overlap(self) if cfg.overlap else None
        self.reset_envs(0)

    def reset_envs(self, iteration: int) -> None:
        """Reset every env with a seed that depends only on (seed, iteration, rank): env i of rank r gets
        ``seed + (iteration * world + r) * num_envs + i``, so a run resumed at an iteration boundary
        seeds its envs the same way every time it is resumed there."""
        num_envs = getattr(self.env, "num_envs", self.num_rows)
        obs, _ = self.env.reset(seed=self.config.seed + (iteration * self.world + self.rank) * num_envs)
        T = self.config.num_steps  # the slot after the rollout holds what the next step starts from
        self._put(T, "obs", obs)
        self._put(T, "mask", self.env.masks)
        self._put(T, "start", np.ones(self.num_rows, bool))
        self._send_staged()
        self._reset_state()
        self.episodes = EpisodeTracker(self.num_rows, self.episodes.agents)  # no half episode is counted
        if self.reward_scaler is not None:
            self.reward_scaler.reset_returns()

    # ------------------------------------------------------------------ storage

    def _allocate_storage(self) -> None:
        T, N, dev = self.config.num_steps, self.num_rows, self.device
        row = self.env.observations
        # Observations, masks and episode starts get T + 1 slots: each env step writes straight into
        # the slot of the step that reads it, and slot T (what follows the rollout) moves to slot 0
        # when the next rollout begins. ``obs``, ``masks`` and ``starts`` are the first T slots.
        self._slots = {
            "obs": torch.zeros((T + 1, N, *row.shape[1:]), dtype=torch_dtype(row.dtype), device=dev),
            "mask": torch.zeros((T + 1, N), dtype=torch.bool, device=dev),
            "start": torch.zeros((T + 1, N), dtype=torch.bool, device=dev),  # first step of an episode: reset state
            "reward": torch.zeros((T, N), device=dev),
            "terminal": torch.zeros((T, N), dtype=torch.bool, device=dev),
            "truncation": torch.zeros((T, N), dtype=torch.bool, device=dev),
        }
        self.obs, self.masks, self.starts = (self._slots[k][:T] for k in ("obs", "mask", "start"))
        self.rewards, self.terminals, self.truncations = (self._slots[k] for k in ("reward", "terminal", "truncation"))
        self.logprobs = torch.zeros((T, N), device=dev)
        self.values = torch.zeros((T, N), device=dev)
        self.final_values = torch.zeros((T, N), device=dev)
        self.segment_states: list = []  # recurrent state at the start of each bptt segment
        # Per-step views, made once: indexing a tensor costs about as much as the small copies themselves.
        self._step_views = [(self._slots["obs"][t], self._slots["start"][t], self.logprobs[t], self.values[t])
                            for t in range(T)]
        self._value_columns = [v.unsqueeze(-1) for v in self.values]  # (N, 1) views: where step functions write
        # packrl's decoders: actions and the rollout's random draws preallocated in the spec's form, each step
        # sampled straight into storage (``_policy_step``); a user decoder's actions are allocated on the first step
        spec = getattr(self.policy.decoder, "spec", None)
        self._spec = spec if isinstance(spec, ActionSpec) else None
        self._sampler: Callable | None = None  # the spec's step_sampler: a discrete draw without a distribution object
        self.actions: Any = None
        self._action_views: list = []
        self._action_host: list = []  # per step: what env.step receives, when it is a view of storage
        self._actions_pinned: torch.Tensor | None = None
        staged = self.stage_on_host if self.stage_on_host is not None else dev.type != "cpu"
        if self._spec is not None:
            self.actions = self._spec.empty_actions((T, N), dev)
            self._noise = self._spec.empty_noise((T, N), dev)
            self._noise_views = [tuple(n[t] for n in self._noise) if isinstance(self._noise, tuple) else self._noise[t]
                                 for t in range(T)]
            self._action_views = [_index(self.actions, t) for t in range(T)]
            if self._spec.kind in ("discrete", "multidiscrete"):
                # the argmax writes (rows, k); a Discrete's (rows,) storage is written through its (rows, 1) view
                self._choice_views = [a.unsqueeze(-1) if self._spec.kind == "discrete" else a for a in self._action_views]
                self._actions_pinned = torch.zeros(self.actions.shape, dtype=self.actions.dtype,
                                                   pin_memory=dev.type == "cuda") if staged else None
                host = self._actions_pinned if staged else self.actions
                self._action_host = list(host.numpy())  # int64 choices: exactly what to_numpy gives, no copy on CPU
                self._sampler = self._spec.step_sampler(N, dev)
        self._forward_function: Callable | None = None  # the policy's training form (_training_forward_function)
        self._step_function: Callable | None = None  # the policy's rollout form (_rollout_step_function), per rollout
        self._graphs: list | None = None  # CUDA graphs of _policy_step, one per step t, captured on first use
        self._truncated: list = []  # (step, rows, final observations, state) of the rollout's truncations
        if not staged:
            # On CPU the env's arrays are written through numpy views of the storage (a numpy copy of a
            # few rows costs a fraction of a torch copy_).
            self._staged: dict | None = None
            self._numpy = {k: v.numpy() for k, v in self._slots.items()}
        else:
            # On CUDA the env's arrays are written by numpy into pinned host copies of the storage and sent to the
            # device once per rollout (``_send_staged``); the observation, which the next step's policy reads, goes
            # each step (and the episode starts, when a recurrent policy reads them).
            self._staged = {k: torch.zeros(v.shape, dtype=v.dtype, pin_memory=dev.type == "cuda")
                            for k, v in self._slots.items()}
            self._numpy = {k: v.numpy() for k, v in self._staged.items()}

    def _put(self, t: int, name: str, array: np.ndarray, rows: slice | None = None) -> None:
        """Write an env array into slot ``t`` of storage ``name`` (its ``rows``: all by default). On CUDA into the
        pinned host copy; the observation (and a recurrent policy's episode starts) is also copied to the device at
        once, without blocking: its host slot is rewritten a whole rollout later, long after the step's action copy
        synchronised the stream."""
        if rows is None:
            self._numpy[name][t] = array
        else:
            self._numpy[name][t][rows] = array
        if self._staged is not None and (name == "obs" or (name == "start" and self.recurrent)):
            if rows is None:
                self._slots[name][t].copy_(self._staged[name][t], non_blocking=True)
            else:
                self._slots[name][t][rows].copy_(self._staged[name][t][rows], non_blocking=True)

    def _send_staged(self) -> None:
        """On CUDA, the env arrays the rollout staged on the host (rewards, ends, masks) to the device, one copy each."""
        if self._staged is not None:
            for name, host in self._staged.items():
                if name != "obs":
                    self._slots[name].copy_(host, non_blocking=True)

    def _store_actions(self, t: int, action: Any) -> None:
        if self.actions is None:
            T = self.config.num_steps
            alloc = lambda a: torch.zeros((T, *a.shape), dtype=a.dtype, device=self.device)  # noqa: E731
            with torch.inference_mode(False):  # storage is a normal tensor (collect steps in inference mode)
                self.actions = {k: alloc(v) for k, v in action.items()} if isinstance(action, dict) else alloc(action)
                self._action_views = [{k: v[i] for k, v in self.actions.items()} if isinstance(self.actions, dict)
                                      else self.actions[i] for i in range(T)]
        view = self._action_views[t]
        if isinstance(action, dict):
            for k, v in action.items():
                view[k].copy_(v)
        else:
            view.copy_(action)

    # ------------------------------------------------------------------ rollout

    def _autocast(self) -> Any:
        """bfloat16 autocast for a forward pass with ``bf16``; else nothing (entering a disabled autocast
        costs microseconds on every rollout step)."""
        if self.config.bf16:  # no cast cache: a captured CUDA graph must not hold casts made outside it
            return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False)
        return contextlib.nullcontext()

    def _rollout_forward(self, x: torch.Tensor, state: Any, done: torch.Tensor) -> tuple:
        """``forward_eval`` under ``_autocast``, without entering a context per step when there is none."""
        if not self.config.bf16:
            return self.forward_eval(x, state, done)
        with self._autocast():
            return self.forward_eval(x, state, done)

    def _training_forward_function(self, x: torch.Tensor) -> Callable | None:
        """The policy's ``forward_function`` for minibatches like ``x``, made anew each update, where it stands for
        ``policy.forward``: eager (the compiled loss traces the modules themselves) and stateless. None otherwise."""
        forward_function = getattr(self.policy, "forward_function", None)
        if self.config.compile or self.recurrent or forward_function is None:
            return None
        return forward_function(x)

    def _rollout_step_function(self, x: torch.Tensor) -> Callable | None:
        """The policy's ``step_function`` for batches like ``x``, made anew each rollout (so it reads the parameters
        the policy holds now), where it stands for ``_rollout_forward``: an eager forward (no compile, no bf16) of a
        stateless policy. None otherwise."""
        if self.forward_eval != self.policy.forward_eval or self.config.bf16 or self.recurrent:
            return None
        step_function = getattr(self.policy, "step_function", None)
        return step_function(x) if step_function is not None else None

    def _reset_state(self) -> None:
        """Zero the recurrent state: in place when CUDA graphs read it from fixed addresses, else anew."""
        if self._graphs is not None:
            for s in self.state:
                s.zero_()
        else:
            self.state = self.policy.initial_state(self.num_rows, self.device)

    def _policy_step(self, t: int) -> None:
        """Step ``t``'s forward, sample, log-prob and value, written into storage. With packrl's decoder it reads
        and writes only preallocated tensors and never syncs with the host, so it can be captured as a CUDA graph;
        on CPU it is a few dozen ops (tests/test_ops_per_step.py counts them)."""
        obs_t, start_t, logprob_t, value_t = self._step_views[t]
        if self._step_function is not None:  # stateless: the values go straight into storage
            logits = self._step_function(obs_t, self._value_columns[t])
        else:
            logits, value, state = self._rollout_forward(obs_t, self.state, start_t)
            if self._graphs is not None:  # a captured graph keeps the state at fixed addresses
                for held, new in zip(self.state, state):
                    held.copy_(new)
            else:
                self.state = state
            value_t.copy_(value if value.ndim == 1 else value.reshape(-1))
        if self._action_host:  # packrl's discrete decoder: choices drawn straight into storage
            self._sample_choices(logits, self._sampler, self._noise_views[t], self._choice_views[t], logprob_t)
            return
        logits = logits if logits.dtype == torch.float32 else logits.float()
        if self._spec is None:  # a decoder of the user's own: its distribution draws its own samples
            dist_ = self.policy.decoder.distribution(logits)
            if hasattr(dist_, "sample_with_log_prob"):
                action, logprob = dist_.sample_with_log_prob()
            else:
                action = dist_.sample()
                logprob = dist_.log_prob(action)
        else:
            action, logprob = self._spec.distribution(logits).sample_with_log_prob(self._noise_views[t])
        logprob_t.copy_(logprob)
        self._store_actions(t, action)

    def _sample_choices(self, logits: torch.Tensor, sampler: Callable | None, noise: torch.Tensor,
                        choice: torch.Tensor, logprob: torch.Tensor) -> None:
        """Discrete choices and their log-probability drawn into storage: ``sampler`` (the spec's ``step_sampler``)
        where there is one, else the distribution's ``sample_into``."""
        logits = logits if logits.dtype == torch.float32 else logits.float()
        if sampler is not None:
            sampler(logits, noise, choice, logprob)
        else:
            self._spec.distribution(logits).sample_into(noise, choice, logprob)

    def _env_actions(self, t: int) -> Any:
        """Step ``t``'s actions as ``env.step`` takes them: a view of storage on CPU, one device-to-host copy on CUDA."""
        if not self._action_host:
            return self.policy.decoder.to_numpy(self._action_views[t])
        if self._actions_pinned is not None:
            self._actions_pinned[t].copy_(self._action_views[t], non_blocking=True)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
        return self._action_host[t]

    def _graphs_wanted(self) -> bool:
        """CUDA graphs for the rollout: on CUDA, with packrl's decoder, when asked (``cuda_graphs``) and every module
        of the policy is graph-safe (``WordEncoder`` reads string lengths on the host: not)."""
        return (self.device.type == "cuda" and self.config.cuda_graphs and self._spec is not None
                and all(getattr(m, "graph_safe", True) for m in self.policy.modules()))

    def _capture_graphs(self) -> None:
        """One CUDA graph per rollout step (step t reads and writes slot t of storage; with ``overlap``, one per step
        and half), sharing one memory pool:
        they replay in the order they were captured. The warm-up runs on a side stream, as torch's CUDA-graph
        notes require, and the state it stepped is put back."""
        self._graphs = []  # from here on the state is kept in place (_reset_state, _policy_step)
        with torch.inference_mode(False):  # normal tensors: _reset_state zeroes them outside inference mode
            self.state = tuple(s.clone() for s in self.state)
        saved = tuple(s.clone() for s in self.state)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        steps = self._overlap.graph_steps() if self._overlap is not None else \
            [lambda t=t: self._policy_step(t) for t in range(self.config.num_steps)]
        with torch.cuda.stream(side):
            for _ in range(3):
                steps[0]()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graphs, pool = [], None
        for step in steps:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                step()
            pool = graph.pool() if pool is None else pool
            graphs.append(graph)
        for held, value in zip(self.state, saved):
            held.copy_(value)
        self._graphs = graphs

    @torch.no_grad()
    def collect(self) -> dict[str, float]:
        """Fill storage with ``num_steps`` steps of every row (the steps in inference mode: no autograd bookkeeping).
        Each step: the policy (``_policy_step``: one CUDA graph replay on CUDA), the actions to the env, the env's
        arrays into storage. Values of truncated rows' final observations are computed after the loop, in one
        forward pass together with the value of the observation that follows the rollout.

        Every autoreset mode of the env (``env.metadata["autoreset_mode"]``) gives the same transitions:
        SAME_STEP as it comes; NEXT_STEP's reset steps (an env's step after its episode ended: its action is
        ignored) are masked out, so they are no decision and are transparent to the advantage chain (reward 0,
        no end), and a truncation bootstraps from the observation the ending step returned (its final
        observation); DISABLED: the envs whose episode ended are reset here, at that step, with
        ``reset(options={"reset_mask": ...})``, which is same-step autoreset."""
        env, T = self.env, self.config.num_steps
        mode = getattr(env, "metadata", {}).get("autoreset_mode", SAME_STEP)
        if mode not in (SAME_STEP, NEXT_STEP, DISABLED):
            raise UsageError(f"PPO: the env's autoreset_mode {mode!r} is none of gymnasium's SAME_STEP, NEXT_STEP "
                             "or DISABLED")
        start_time = time.perf_counter()
        for name in ("obs", "mask", "start"):  # where the previous rollout (or the reset) left off
            self._slots[name][0].copy_(self._slots[name][T])
            if self._staged is not None:
                self._numpy[name][0] = self._numpy[name][T]
        self.segment_states = []
        self._truncated = []
        if self._graphs is None:  # captured graphs hold the buffers of the step function they were captured with
            if self._overlap is None:
                self._step_function = self._rollout_step_function(self._step_views[0][0])
            else:
                self._overlap.step_function = self._rollout_step_function(self._overlap.views[0][0][0])
        with torch.inference_mode():  # what it makes stays inside: storage, and the state it carries
            if self._spec is not None:
                self._spec.fill_noise(self._noise)  # every step's random draws at once
            if self._graphs is None and self._graphs_wanted():
                self._capture_graphs()
            if self._overlap is not None:
                self._overlap.run()
            else:
                self._step_envs(env, mode)
        self.rollout_step = None
        self._send_staged()
        self.next_value = self._bootstrap_values()
        # rows waiting for their turn after the rollout: their pending decision waits for the next rollout's data
        self.train_masks, self.train_rewards, self.bootstrap_value = cut_pending_decisions(
            self.values, self.rewards, self.terminals, self.truncations, self.masks, self.next_value,
            self._slots["mask"][T])
        self._check_env_values()
        rewards, terminals, truncations, masks = (self._host_array(k) for k in ("reward", "terminal", "truncation", "mask"))
        if self.reward_scaler is not None:  # the learner's rewards only: episode returns stay in the env's units
            factor = self.reward_scaler.update(rewards, terminals | truncations, masks)
            self.train_rewards = (self.train_rewards * factor).clamp(-REWARD_CLIP, REWARD_CLIP)
        self.episodes.record(rewards, terminals | truncations, masks)
        acted = int(np.count_nonzero(masks))
        acted = all_sum(acted, self.device) if self.world > 1 else acted
        self.global_step += acted
        return {"rollout_seconds": time.perf_counter() - start_time, "agent_steps": acted}

    def _step_envs(self, env: Any, mode: Any) -> None:
        """The synchronous rollout: each step, the policy for every row, then every env."""
        recurrent = self.recurrent
        for t in range(self.config.num_steps):
            self.rollout_step = t  # where an error that stops the rollout left it (session.error_line)
            if recurrent and t % self.horizon == 0:
                self.segment_states.append(tuple(s.clone() for s in self.state))
            if self._graphs:
                self._graphs[t].replay()
            else:
                self._policy_step(t)
            if mode == NEXT_STEP:
                resetting = self._env_rows(env.ended_envs)  # these envs reset at this step, ignoring the action
            obs, rewards, terminals, truncations, _ = env.step(self._env_actions(t))
            terminals, truncations = np.asarray(terminals), np.asarray(truncations)
            self._store_outcome(t, rewards, terminals, truncations, env.final_observations)
            if mode == SAME_STEP:
                masks, starts = env.masks, np.logical_or(terminals, truncations)
            elif mode == NEXT_STEP:
                # the envs that ended return their final observation: no start, and the next step is a reset
                ended = self._env_rows(env.ended_envs)
                masks, starts = env.masks & ~ended, (np.logical_or(terminals, truncations) & ~ended) | resetting
            else:
                obs, masks, starts = self._reset_ended(env, obs, terminals, truncations)
            self._store_next(t, obs, masks, starts)

    def _store_outcome(self, t: int, rewards: np.ndarray, terminals: np.ndarray, truncations: np.ndarray,
                       final_observations: np.ndarray, rows: slice | None = None) -> None:
        """Step ``t``'s rewards and ends into storage (its ``rows``: all by default), and each truncation's final
        observation, with the state that saw its episode, kept for its bootstrap value (``_bootstrap_values``)."""
        self._put(t, "reward", rewards, rows)
        self._put(t, "terminal", terminals, rows)
        self._put(t, "truncation", truncations, rows)
        if np.count_nonzero(truncations) and (truncated := np.flatnonzero(truncations & ~terminals)).size:
            index = torch.from_numpy(truncated).to(self.device) if self.state else None
            first = 0 if rows is None else rows.start
            self._truncated.append((t, truncated + first, final_observations[truncated],
                                    tuple(s[index] for s in self.state)))

    def _store_next(self, t: int, obs: np.ndarray, masks: np.ndarray, starts: np.ndarray,
                    rows: slice | None = None) -> None:
        """What step ``t + 1`` starts from (observations, masks, episode starts) into storage (its ``rows``)."""
        self._put(t + 1, "obs", obs, rows)
        self._put(t + 1, "mask", masks, rows)
        self._put(t + 1, "start", starts, rows)

    def _env_rows(self, per_env: np.ndarray) -> np.ndarray:
        """One flag per env as one flag per row (every row of an env shares its env's flag)."""
        per_row = int(getattr(self.env, "agents_per_env", 1))
        return per_env if per_row == 1 else np.repeat(per_env, per_row)

    def _reset_ended(self, env: Any, obs: np.ndarray, terminals: np.ndarray, truncations: np.ndarray) -> tuple:
        """DISABLED: reset the envs whose episode ended at this step (the truncations' final observations were
        copied before); ``(observations, masks, starts)`` as a same-step autoreset gives them."""
        starts = np.logical_or(terminals, truncations)  # before the reset, which clears the flags' rows
        ended = env.ended_envs
        if ended.any():
            obs, _ = env.reset(options={"reset_mask": ended})
        return obs, env.masks, starts

    def _host_array(self, name: str) -> np.ndarray:
        """Storage ``name`` as a numpy array: a view of it on CPU, of its pinned host copy on CUDA."""
        return self._numpy[name][: self.config.num_steps]

    def _bootstrap_values(self) -> torch.Tensor:
        """V(observation after the rollout) of every row, and V(final observation) of each truncation of the
        rollout written into ``final_values``, in one forward pass. A truncated row's final value is read with the
        state that saw its episode (the state after the step that ended it)."""
        T, N = self.config.num_steps, self.num_rows
        x, done, state = self._slots["obs"][T], self._slots["start"][T], self.state
        if self._truncated:
            finals = torch.as_tensor(np.concatenate([f for _, _, f, _ in self._truncated])).to(self.device)
            x = torch.cat([x, finals.reshape(-1, *x.shape[1:]).to(x.dtype)])
            done = torch.cat([done, torch.zeros(finals.shape[0], dtype=torch.bool, device=self.device)])
            state = tuple(torch.cat([s, *(snap[i] for _, _, _, snap in self._truncated)])
                          for i, s in enumerate(state))
        with self._autocast():
            _, values, _ = self.forward_eval(x, state, done)
        values = values.float().reshape(-1)
        self.final_values.zero_()
        if self._truncated:
            steps = np.concatenate([np.full(len(rows), t) for t, rows, _, _ in self._truncated])
            rows = np.concatenate([rows for _, rows, _, _ in self._truncated])
            self.final_values[torch.from_numpy(steps).to(self.device), torch.from_numpy(rows).to(self.device)] = values[N:]
        return values[:N]

    def _check_env_values(self) -> None:
        """Refuse a rollout in which the env gave a NaN or infinite reward (any row) or observation (a row
        that acted on it), naming the first by step, env row and leaf. One host sync when all is finite."""
        T = self.config.num_steps
        checks = [("reward", ~torch.isfinite(self.rewards), self.rewards, list(range(self.num_rows)))]
        for name, values, rows in self._float_observation_leaves():
            bad = ~torch.isfinite(values).reshape(T, len(rows), -1).all(-1)
            checks.append((f"observation leaf {name}", self._scatter_rows(bad, rows) & self.masks, values, rows))
        if not bool(torch.stack([bad.any() for _, bad, _, _ in checks]).any()):
            return
        firsts = []
        for what, bad, values, rows in checks:
            if bool(bad.any()):
                t, row = (int(i) for i in torch.nonzero(bad)[0])  # row-major: the earliest step first
                held = values[t, rows.index(row)].reshape(-1)
                firsts.append((t, row, what, float(held[~torch.isfinite(held)][0])))
        t, row, what, value = min(firsts)
        env_index = row // getattr(self.env, "agents_per_env", 1)
        raise NonFiniteError(f"iteration {self.iteration + 1}, rollout step {t}: env row {row} (env {env_index}) "
                             f"gave a non-finite {what}: {value} (the first non-finite value of the rollout)", {})

    def _float_observation_leaves(self) -> list[tuple[str, torch.Tensor, list[int]]]:
        """(leaf name, (T, rows, ...) typed view of the stored observations, rows) for every float leaf."""
        obs = self.obs
        if obs.dtype != torch.uint8:  # a Box observation passed through as it is
            return [("(the Box observation)", obs, list(range(self.num_rows)))] if obs.is_floating_point() else []
        emulated = getattr(self.env, "emulated", None)
        if emulated is None:
            return []
        leaves = []
        described = len(emulated.row_group)  # rows of one env (vector backends) or of all envs (Numba)
        for group in emulated.groups:
            rows = sorted(e * described + r for e in range(max(self.num_rows // described, 1)) for r in group.rows)
            for leaf in group.observation.leaves:
                if leaf.dtype.kind == "f" and leaf.nbytes:
                    view = obs[..., leaf.offset:leaf.offset + leaf.nbytes]
                    if rows != list(range(self.num_rows)):
                        view = view[:, rows]
                    name = f"{leaf.name} (agent group {group.index})" if emulated.heterogeneous else leaf.name
                    leaves.append((name, view.view(torch_dtype(leaf.dtype)), rows))
        return leaves

    def _scatter_rows(self, bad: torch.Tensor, rows: list[int]) -> torch.Tensor:
        if len(rows) == self.num_rows and rows == list(range(self.num_rows)):
            return bad
        full = torch.zeros((bad.shape[0], self.num_rows), dtype=torch.bool, device=bad.device)
        full[:, rows] = bad
        return full

    # ------------------------------------------------------------------ advantages

    def advantages(self, ratios: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, value targets), both 0 on rows left out of training (``train_masks``: masked rows,
        and the pending last decision of a row waiting for its turn, ``cut_pending_decisions``) so nothing
        they hold reaches a gradient."""
        cfg = self.config
        terminals = self.terminals if cfg.bootstrap_truncation else self.terminals | self.truncations
        advantages = compute_advantages(
            self.values, self.train_rewards, terminals, self.truncations, self.final_values, self.bootstrap_value,
            self.train_masks, cfg.gamma, cfg.gae_lambda, ratios, cfg.rho_clip, cfg.c_clip).to(self.device)
        return advantages, torch.where(self.train_masks, advantages + self.values, 0.0)

    # ------------------------------------------------------------------ update

    def _segments(self, x: torch.Tensor) -> torch.Tensor:
        """(T, N, ...) -> (segments, horizon, ...): each row's rollout cut into bptt windows."""
        T, N, L = x.shape[0], x.shape[1], self.horizon
        return x.reshape(T // L, L, N, *x.shape[2:]).transpose(1, 2).reshape(T // L * N, L, *x.shape[2:])

    def _batch(self) -> dict[str, Any]:
        """The rollout as (segment, time, ...) tensors (``_segments``), with the recurrent state at the start
        of each segment. Rows left out of training hold log-prob and value 0, so nothing they carry reaches
        a loss; ``advantages`` and ``returns`` are added per epoch."""
        masks, actions = self.train_masks, self.actions
        return {
            "obs": self._segments(self.obs), "masks": self._segments(masks), "starts": self._segments(self.starts),
            "logprobs": self._segments(torch.where(masks, self.logprobs, 0.0)),
            "values": self._segments(torch.where(masks, self.values, 0.0)),
            "actions": ({k: self._segments(v) for k, v in actions.items()} if isinstance(actions, dict)
                        else self._segments(actions)),
            "states": tuple(torch.stack(parts).reshape(-1, *parts[0].shape[1:]) for parts in zip(*self.segment_states)),
        }

    def update(self) -> dict[str, float]:
        """``update_epochs`` passes of shuffled minibatches over the rollout (CleanRL's loop). With
        ``target_kl``, the epochs stop once the last minibatch's approx_kl exceeds it (CleanRL's rule)."""
        cfg = self.config
        start_time = time.perf_counter()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        advantages, returns = self.advantages()
        b = self._batch()
        self._forward_function = self._training_forward_function(b["obs"])
        num_segments = b["obs"].shape[0]
        minibatch_size = max(num_segments // cfg.num_minibatches, 1)
        # With no row left out (single-agent envs), masked means are plain means: one host sync here
        # saves a where and a division in every mean of every minibatch.
        all_acting = bool(self.train_masks.all())
        # One minibatch is the whole batch: a shuffle would only reorder the terms of its means, so it is read
        # in place (no permutation drawn, no gathered copies).
        whole = minibatch_size >= num_segments
        b["advantages"], b["returns"] = self._segments(advantages), self._segments(returns)
        # The whole batch as the one minibatch: its normalized advantages are the same in every epoch (V-trace's
        # change between epochs), so they are normalized once here instead of in each epoch's loss.
        normalize_once = cfg.norm_adv and whole and not cfg.vtrace
        if normalize_once:
            b["advantages"] = _normalize(b["advantages"], *_masked_mean(None if all_acting else b["masks"]))
        losses, kl_parts, positions = [], [], []  # per minibatch, tensors until the end: one host sync
        for epoch in range(cfg.update_epochs):
            if cfg.vtrace and epoch > 0:
                advantages, returns = self.advantages(self._current_ratios(b))
                b["advantages"], b["returns"] = self._segments(advantages), self._segments(returns)
            order = None if whole else torch.randperm(num_segments, device=self.device)
            for first in range(0, num_segments, minibatch_size):
                mb = slice(None) if order is None else order[first:first + minibatch_size]
                mask = None if all_acting else b["masks"][mb]
                loss, terms, logratio = self.minibatch_loss(b, mb, mask, cfg.norm_adv and not normalize_once)
                self.optimizer.zero_grad()
                loss.backward()
                if self.world > 1:
                    average_gradients(params)
                grad_norm = self.optimizer.clip_grad_norm(cfg.max_grad_norm)
                self.optimizer.step()
                losses.append((*terms, grad_norm))
                kl_parts.append((logratio, mask))
                positions.append((epoch, first // minibatch_size))
            if cfg.target_kl is not None and _kl_statistics(kl_parts[-1:], cfg.clip_coef)["approx_kl"] > cfg.target_kl:
                break
        stats = self._update_statistics(params, losses, kl_parts, positions, returns, start_time)
        self._update_observation_statistics()
        return stats

    def _update_observation_statistics(self) -> None:
        """A normalizing encoder's running statistics take in this rollout's acting rows (after the update, so the
        rollout and the update that reads it saw the same statistics); averaged over ranks, so weights agree."""
        update = getattr(self.policy, "update_normalization", None)
        if update is None:
            return
        update(self.obs[self.train_masks])
        if self.world > 1:
            self.policy.average_normalization(self.world)

    def _minibatch_loss(self, b: dict[str, Any], mb: torch.Tensor | slice, mask: torch.Tensor | None,
                        normalize: bool = True) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
        """CleanRL's PPO loss on the segments ``mb`` of the batch ``b``: ``(loss, (pg_loss, v_loss, entropy),
        logratio)``. ``mask`` (the rows that acted) weighs every mean; None: every row counts. ``normalize``:
        normalize the minibatch's advantages here (False: ``b`` holds them normalized already)."""
        cfg = self.config
        mean, count = _masked_mean(mask)
        # episode starts matter only to recurrent state (the MLP ignores them)
        states, starts = (tuple(s[mb] for s in b["states"]), b["starts"][mb]) if self.recurrent else ((), None)
        with self._autocast():
            if self._forward_function is not None:
                logits, newvalue = self._forward_function(b["obs"][mb])
            else:
                logits, newvalue, _ = self.policy.forward(b["obs"][mb], states, starts)
        dist_ = self.policy.decoder.distribution(logits.float())
        logratio = dist_.log_prob(_index(b["actions"], mb)) - b["logprobs"][mb]
        if mask is not None:
            logratio = torch.where(mask, logratio, 0.0)
        ratio = logratio.exp()

        mb_advantages = b["advantages"][mb]
        if normalize:
            mb_advantages = _normalize(mb_advantages, mean, count)
        neg_advantages = -mb_advantages
        pg_loss1 = neg_advantages * ratio
        pg_loss2 = neg_advantages * torch.clamp(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)
        pg_loss = mean(torch.max(pg_loss1, pg_loss2))

        newvalue = newvalue.float()
        if newvalue.shape != logratio.shape:  # a decoder's (B, T, 1) values; a reshape is a node to backpropagate
            newvalue = newvalue.reshape(logratio.shape)
        mb_returns = b["returns"][mb]
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        if cfg.clip_vloss:
            mb_values = b["values"][mb]
            v_clipped = mb_values + torch.clamp(newvalue - mb_values, -cfg.clip_coef, cfg.clip_coef)
            v_loss = 0.5 * mean(torch.max(v_loss_unclipped, (v_clipped - mb_returns) ** 2))
        else:
            v_loss = 0.5 * mean(v_loss_unclipped)

        entropy_loss = mean(dist_.entropy())
        loss = pg_loss - cfg.ent_coef * entropy_loss + v_loss * cfg.vf_coef
        return loss, (pg_loss.detach(), v_loss.detach(), entropy_loss.detach()), logratio.detach()

    def _update_statistics(self, params: list[torch.Tensor], losses: list[tuple], kl_parts: list[tuple],
                           positions: list[tuple[int, int]], returns: torch.Tensor, start_time: float) -> dict[str, float]:
        """The update's figures, means over its minibatches (one host sync); NonFiniteError when a loss, a
        gradient or a parameter went non-finite."""
        per_minibatch = {k: torch.stack(v) for k, v in zip(("pg_loss", "v_loss", "entropy", "grad_norm"), zip(*losses))}
        with torch.no_grad():
            parameter_norms = torch.stack([torch.linalg.vector_norm(p) for p in params]) if params \
                else torch.zeros(0, device=self.device)
        out = {k: v.mean() for k, v in per_minibatch.items()}
        out.update(_kl_statistics(kl_parts, self.config.clip_coef))
        out["all_finite"] = torch.isfinite(torch.cat([v.float() for v in (*per_minibatch.values(), parameter_norms)])).all()
        out = {k: v.item() for k, v in out.items()}
        out["explained_variance"] = _explained_variance(self.values, returns, self.train_masks)
        out["learning_rate"] = self.optimizer.param_groups[0]["lr"]
        out["update_seconds"] = time.perf_counter() - start_time
        if not out.pop("all_finite"):
            raise NonFiniteError(self._first_non_finite(per_minibatch, positions, parameter_norms), out)
        return out

    def _first_non_finite(self, per_minibatch: dict[str, torch.Tensor], positions: list[tuple[int, int]],
                          parameter_norms: torch.Tensor) -> str:
        """Which quantity of the update went non-finite first: a loss term or the gradient of a minibatch, in
        the order they were computed, else a parameter (by name)."""
        where = f"iteration {self.iteration + 1}"
        names = {"pg_loss": "policy loss", "v_loss": "value loss", "entropy": "entropy", "grad_norm": "gradient norm"}
        values = {k: v.tolist() for k, v in per_minibatch.items()}
        for i, (epoch, mb) in enumerate(positions):
            for key, label in names.items():
                if not math.isfinite(values[key][i]):
                    return (f"{where}, epoch {epoch + 1}, minibatch {mb + 1}: the {label} is {values[key][i]} "
                            "(the first non-finite quantity of the update)")
        named = [n for n, p in self.policy.named_parameters() if p.requires_grad]
        for name, norm in zip(named, parameter_norms.tolist()):
            if not math.isfinite(norm):
                return f"{where}: parameter {name!r} holds a non-finite value after the update"
        return f"{where}: a non-finite value in the update"

    @torch.no_grad()
    def _current_ratios(self, b: dict[str, Any]) -> torch.Tensor:
        """pi_current / pi_rollout for every stored step of the batch ``b``, back in (T, N) order (for V-trace clipping)."""
        with self._autocast():
            logits, _, _ = self.forward(b["obs"], b["states"], b["starts"])
        logratio = self.policy.decoder.distribution(logits.float()).log_prob(b["actions"]) - b["logprobs"]
        T, N, L = self.config.num_steps, self.num_rows, self.horizon
        return logratio.exp().reshape(T // L, N, L).transpose(1, 2).reshape(T, N)

    # ------------------------------------------------------------------ loop

    def train(self, total_steps: int, callback: Callable[[dict], Any] | None = None) -> list[dict]:
        """Iterate until the run has taken ``total_steps`` agent steps (acting rows, all ranks), counting
        the steps of a restored state (``load_training_state``): a resumed run continues, it does not start over.
        The learning rate anneals linearly with the steps taken. ``callback(stats)`` after each iteration;
        returning a false value other than None (``False``, ``np.False_``, 0) stops early; returning
        nothing goes on. Returns the per-iteration stats."""
        cfg = self.config
        history = []
        while self.global_step < total_steps:
            if cfg.anneal_lr:
                self.optimizer.param_groups[0]["lr"] = (1.0 - self.global_step / total_steps) * cfg.learning_rate
            tic = time.perf_counter()
            before = self.global_step
            stats = self.collect()
            if self.global_step == before:
                raise RuntimeError(f"iteration {self.iteration + 1}: no row acted in {cfg.num_steps} steps; "
                                   "the env masks every row, so training cannot advance")
            stats.update(self.update())
            self.iteration += 1
            stats.update(iteration=self.iteration, global_step=self.global_step,
                         sps=stats["agent_steps"] / (time.perf_counter() - tic))
            stats.update(self.episodes.pop())
            history.append(stats)
            if callback is not None and _stops(callback(stats)):
                break
        return history

    # ------------------------------------------------------------------ resuming

    def training_state(self) -> dict:
        """What a resumed run needs besides the weights and the optimizer: counters and every RNG state,
        as JSON-able data (the RNG states as base64 strings)."""
        np_state = np.random.get_state()
        return {
            **({"reward_scaling": self.reward_scaler.state()} if self.reward_scaler is not None else {}),
            "global_step": self.global_step, "iteration": self.iteration,
            "rng": {"torch": _b64(torch.get_rng_state()),
                    "cuda": [_b64(t) for t in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
                    "numpy": [np_state[0], _b64(torch.from_numpy(np_state[1].astype(np.uint32).view(np.uint8))),
                              int(np_state[2]), int(np_state[3]), float(np_state[4])],
                    "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]]},
        }

    def load_training_state(self, state: dict, policy_state: dict, optimizer_state: dict | None) -> None:
        """Continue from ``training_state()`` and the saved weights and optimizer: counters, RNG states, and envs
        reset with the seeds of the iteration the state was taken at (``reset_envs``)."""
        self.policy.load_state_dict(policy_state)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.global_step, self.iteration = int(state["global_step"]), int(state["iteration"])
        if self.reward_scaler is not None and "reward_scaling" in state:
            self.reward_scaler.load(state["reward_scaling"])
        self.reset_envs(self.iteration)
        rng = state["rng"]
        torch.set_rng_state(_unb64(rng["torch"]))
        if rng.get("cuda") and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([_unb64(t) for t in rng["cuda"]])
        name, keys, pos, has_gauss, gauss = rng["numpy"]
        np.random.set_state((name, _unb64(keys).numpy().view(np.uint32), pos, has_gauss, gauss))
        version, internal, gauss_next = rng["python"]
        random.setstate((version, tuple(internal), gauss_next))

    def hyperparameters(self) -> dict:
        return asdict(self.config)


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _stops(answer: Any) -> bool:
    """A callback's answer asks to stop when it is false but not None (a numpy bool counts)."""
    return answer is not None and not bool(answer)


def _masked_mean(mask: torch.Tensor | None) -> tuple[Callable, torch.Tensor | None]:
    """``(mean, count)`` over the rows ``mask`` marks (masked rows weigh nothing); None: a plain mean."""
    if mask is None:
        return torch.mean, None
    count = mask.sum().clamp(min=1).float()
    return (lambda x: torch.where(mask, x, 0.0).sum() / count), count


def _normalize(x: torch.Tensor, mean: Callable, count: torch.Tensor | None) -> torch.Tensor:
    """(x - mean) / (std + 1e-8), with the unbiased std over the rows ``mean`` counts (``count`` of them;
    None: all). One element has std 0 here (torch.std gives NaN)."""
    if count is None:
        m = x.mean()
        std = x.std() if x.numel() > 1 else torch.zeros_like(m)
    else:
        m = mean(x)
        std = (mean((x - m) ** 2) * count / (count - 1).clamp(min=1.0)).sqrt()
    return (x - m) / (std + 1e-8)


def _kl_statistics(parts: list[tuple[torch.Tensor, torch.Tensor | None]], clip_coef: float) -> dict[str, torch.Tensor]:
    """Means over minibatches of the per-minibatch (masked) ``old_approx_kl``, ``approx_kl`` and ``clipfrac``
    from each minibatch's (logratio, mask); a mask of None means every row acted. Minibatches of one
    shape are reduced together, in a few ops."""
    if len({p[0].shape for p in parts}) == 1:
        masks = [p[1] for p in parts]
        groups = [(torch.stack([p[0] for p in parts]),
                   None if all(m is None for m in masks) else
                   torch.stack([torch.ones_like(p[0], dtype=torch.bool) if m is None else m for p, m in zip(parts, masks)]))]
    else:
        groups = [(p[0][None], None if p[1] is None else p[1][None]) for p in parts]
    per: dict[str, list] = {"old_approx_kl": [], "approx_kl": [], "clipfrac": []}
    for logratio, mask in groups:
        ratio = logratio.exp()
        per["old_approx_kl"].append(_minibatch_means(-logratio, mask))
        per["approx_kl"].append(_minibatch_means((ratio - 1) - logratio, mask))
        per["clipfrac"].append(_minibatch_means(((ratio - 1.0).abs() > clip_coef).float(), mask))
    return {k: torch.cat(v).mean() for k, v in per.items()}


def _minibatch_means(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of each minibatch (dim 0) over the rows its mask keeps (all rows without a mask)."""
    dims = tuple(range(1, x.ndim))
    if mask is None:
        return x.mean(dims)
    return torch.where(mask, x, 0.0).sum(dims) / mask.sum(dims).clamp(min=1)


def _index(actions: Any, idx: torch.Tensor | slice) -> Any:
    return {k: v[idx] for k, v in actions.items()} if isinstance(actions, dict) else actions[idx]


def _explained_variance(values: torch.Tensor, returns: torch.Tensor, masks: torch.Tensor) -> float:
    y_pred, y_true = values[masks].double(), returns[masks].double()
    var_y = y_true.var() if y_true.numel() > 1 else torch.tensor(float("nan"))
    return float("nan") if not torch.isfinite(var_y) or var_y == 0 else float(1 - (y_true - y_pred).var() / var_y)
