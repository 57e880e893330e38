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

from packrl.errors import PackrlError
from packrl.hyperparameters import PPOConfig
from packrl.models.grouped import GroupedPolicy
from packrl.train.advantage import compute_advantages, cut_pending_decisions
from packrl.train.distributed import (
    all_sum,
    average_gradients,
    broadcast_parameters,
    rank_and_world,
)
from packrl.train.graphs import StepGraphs, graphs_wanted
from packrl.train.optimizer import adam
from packrl.train.overlap import OverlappedRollout
from packrl.train.reward_scaling import CLIP as REWARD_CLIP
from packrl.train.reward_scaling import RewardScaler
from packrl.train.rollout import PolicyStep, SynchronousRollout, autocast
from packrl.train.rollout_checks import first_non_finite_env_value
from packrl.train.storage import RolloutStorage, index


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
    ``final_observations``); ``policy`` is a ``packrl.models.Policy``. The rollout lives in ``storage``
    (``RolloutStorage``), is filled by ``driver`` (``SynchronousRollout``, or ``OverlappedRollout`` with
    ``overlap``) running ``step`` (``PolicyStep``), as CUDA graphs where ``graphs`` captured them."""

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
        self.grouped = isinstance(policy, GroupedPolicy)  # its calls name each row's index (``_rows``)
        self.horizon = (cfg.bptt_horizon or cfg.num_steps) if self.recurrent else 1
        if cfg.num_steps % self.horizon:
            raise ValueError(f"num_steps={cfg.num_steps} must be a multiple of bptt_horizon={self.horizon}")
        self.num_rows = vecenv.num_agents
        self.global_step = 0  # agent steps (acting rows) summed over ranks
        self.iteration = 0
        self.episodes = EpisodeTracker(self.num_rows, row_agents(vecenv))
        self.reward_scaler = RewardScaler(self.num_rows, cfg.gamma) if cfg.normalize_rewards else None
        staged = self.stage_on_host if self.stage_on_host is not None else self.device.type != "cpu"
        self.storage = RolloutStorage(vecenv.observations, cfg.num_steps, self.num_rows, self.device,
                                      self.policy.decoder, staged, self.recurrent)
        self.step = PolicyStep(self.policy, self.storage, self.forward_eval, cfg.bf16)
        self.driver = OverlappedRollout(vecenv, self.storage, self.step) if cfg.overlap else \
            SynchronousRollout(vecenv, self.storage, self.step, self.horizon)
        self.graphs = StepGraphs(graphs_wanted(self.device, cfg.cuda_graphs, self.storage.spec is not None, self.policy))
        self._forward_function: Callable | None = None  # the policy's training form (_training_forward_function)
        self.reset_envs(0)

    # the rollout in storage, read-only: (T, rows, ...) views
    obs = property(lambda self: self.storage.obs)
    masks = property(lambda self: self.storage.masks)
    starts = property(lambda self: self.storage.starts)
    rewards = property(lambda self: self.storage.rewards)
    terminals = property(lambda self: self.storage.terminals)
    truncations = property(lambda self: self.storage.truncations)
    actions = property(lambda self: self.storage.actions)
    logprobs = property(lambda self: self.storage.logprobs)
    values = property(lambda self: self.storage.values)
    final_values = property(lambda self: self.storage.final_values)
    segment_states = property(lambda self: self.storage.segment_states)
    rollout_step = property(lambda self: self.driver.rollout_step, doc="the step collect() is at, None outside one")

    def reset_envs(self, iteration: int) -> None:
        """Reset every env with a seed that depends only on (seed, iteration, rank): env i of rank r gets
        ``seed + (iteration * world + r) * num_envs + i``, so a run resumed at an iteration boundary
        seeds its envs the same way every time it is resumed there."""
        num_envs = getattr(self.env, "num_envs", self.num_rows)
        obs, _ = self.env.reset(seed=self.config.seed + (iteration * self.world + self.rank) * num_envs)
        self.storage.store_reset(obs, self.env.masks)
        self.step.reset_state()
        self.episodes = EpisodeTracker(self.num_rows, self.episodes.agents)  # no half episode is counted
        if self.reward_scaler is not None:
            self.reward_scaler.reset_returns()

    def _autocast(self) -> Any:
        return autocast(self.device, self.config.bf16)

    # ------------------------------------------------------------------ rollout

    @torch.no_grad()
    def collect(self) -> dict[str, float]:
        """Fill storage with ``num_steps`` steps of every row (the steps in inference mode: no autograd bookkeeping),
        by the driver (every autoreset mode of the env gives the same transitions: ``packrl/train/rollout.py``).
        Values of truncated rows' final observations are computed after the loop, in one forward pass together
        with the value of the observation that follows the rollout."""
        self.driver.check()
        start_time = time.perf_counter()
        self.storage.begin_rollout()
        if not self.graphs.captured:  # captured graphs hold the buffers of the step function they were captured with
            self.step.prepare(self.driver.first_views().obs)
        with torch.inference_mode():  # what it makes stays inside: storage, and the state it carries
            self.storage.draw_noise()  # every step's random draws at once
            self.driver.run(self.graphs.steps(self.driver.eager_steps, self.step))
        self.storage.send_staged()
        self.next_value = self.storage.bootstrap_values(self._value_of, self.step.state)
        # rows waiting for their turn after the rollout: their pending decision waits for the next rollout's data
        self.train_masks, self.train_rewards, self.bootstrap_value = cut_pending_decisions(
            self.values, self.rewards, self.terminals, self.truncations, self.masks, self.next_value,
            self.storage.next_masks)
        return self._account(start_time)

    def _value_of(self, x: torch.Tensor, state: tuple, done: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return self.forward_eval(x, state, done, **_rows(self.grouped, rows))[1]

    def _account(self, start_time: float) -> dict[str, float]:
        """After a rollout: refuse non-finite env values, scale the learner's rewards, record episodes, count steps."""
        problem = first_non_finite_env_value(self.storage, self.env, self.iteration + 1)
        if problem is not None:
            raise NonFiniteError(problem, {})
        rewards, terminals, truncations, masks = (self.storage.host_array(k)
                                                  for k in ("reward", "terminal", "truncation", "mask"))
        if self.reward_scaler is not None:  # the learner's rewards only: episode returns stay in the env's units
            factor = self.reward_scaler.update(rewards, terminals | truncations, masks)
            self.train_rewards = (self.train_rewards * factor).clamp(-REWARD_CLIP, REWARD_CLIP)
        self.episodes.record(rewards, terminals | truncations, masks)
        acted = int(np.count_nonzero(masks))
        acted = all_sum(acted, self.device) if self.world > 1 else acted
        self.global_step += acted
        return {"rollout_seconds": time.perf_counter() - start_time, "agent_steps": acted}

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
        return RolloutStorage.segments(x, self.horizon)

    def _batch(self) -> dict[str, Any]:
        """The rollout as (segment, time, ...) tensors; ``advantages`` and ``returns`` are added per epoch."""
        return self.storage.batch(self.train_masks, self.horizon)

    def _training_forward_function(self, x: torch.Tensor) -> Callable | None:
        """The policy's ``forward_function`` for minibatches like ``x``, made anew each update, where it stands for
        ``policy.forward``: eager (the compiled loss traces the modules themselves) and stateless. None otherwise."""
        forward_function = getattr(self.policy, "forward_function", None)
        if self.config.compile or self.recurrent or forward_function is None:
            return None
        return forward_function(x)

    def _prepared_batch(self) -> tuple[dict[str, Any], torch.Tensor, bool, bool]:
        """The update's batch with its advantages and returns, the (T, N) returns, whether every row acted (masked means are plain
        means then: one host sync here saves a where and a division in every mean of every minibatch), and whether
        the advantages were normalized once here (the whole batch as the one minibatch without V-trace: they are
        the same in every epoch)."""
        cfg = self.config
        advantages, returns = self.advantages()
        b = self._batch()
        self._forward_function = self._training_forward_function(b["obs"])
        all_acting = bool(self.train_masks.all())
        b["advantages"], b["returns"] = self._segments(advantages), self._segments(returns)
        num_segments = b["obs"].shape[0]
        normalize_once = cfg.norm_adv and self._minibatch_size(num_segments) >= num_segments and not cfg.vtrace
        if normalize_once:
            b["advantages"] = _normalize(b["advantages"], *_masked_mean(None if all_acting else b["masks"]))
        return b, returns, all_acting, normalize_once

    def _minibatch_size(self, num_segments: int) -> int:
        return max(num_segments // self.config.num_minibatches, 1)

    def update(self) -> dict[str, float]:
        """``update_epochs`` passes of shuffled minibatches over the rollout (CleanRL's loop). With
        ``target_kl``, the epochs stop once the last minibatch's approx_kl exceeds it (CleanRL's rule)."""
        cfg = self.config
        start_time = time.perf_counter()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        b, returns, all_acting, normalize_once = self._prepared_batch()
        num_segments = b["obs"].shape[0]
        minibatch_size = self._minibatch_size(num_segments)
        # One minibatch is the whole batch: a shuffle would only reorder the terms of its means, so it is read
        # in place (no permutation drawn, no gathered copies).
        whole = minibatch_size >= num_segments
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
                losses.append((*terms, self._optimizer_step(loss, params)))
                kl_parts.append((logratio, mask))
                positions.append((epoch, first // minibatch_size))
            if cfg.target_kl is not None and _kl_statistics(kl_parts[-1:], cfg.clip_coef)["approx_kl"] > cfg.target_kl:
                break
        stats = self._update_statistics(params, losses, kl_parts, positions, returns, start_time)
        self._update_observation_statistics()
        return stats

    def _optimizer_step(self, loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """Backpropagate ``loss``, average gradients over ranks, clip, step; returns the gradient norm."""
        self.optimizer.zero_grad()
        loss.backward()
        if self.world > 1:
            average_gradients(params)
        grad_norm = self.optimizer.clip_grad_norm(self.config.max_grad_norm)
        self.optimizer.step()
        return grad_norm

    def _update_observation_statistics(self) -> None:
        """A normalizing encoder's running statistics take in this rollout's acting rows (after the update, so the
        rollout and the update that reads it saw the same statistics); averaged over ranks, so weights agree."""
        update = getattr(self.policy, "update_normalization", None)
        if update is None:
            return
        update(self.obs[self.train_masks], **_rows(self.grouped, self.storage.row_indices, self.train_masks))
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
                logits, newvalue, _ = self.policy.forward(b["obs"][mb], states, starts,
                                                          **_rows(self.grouped, b["rows"], mb))
        dist_ = self.policy.decoder.distribution(logits.float())
        logratio = dist_.log_prob(index(b["actions"], mb)) - b["logprobs"][mb]
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
            raise NonFiniteError(_first_non_finite(self.policy, self.iteration, per_minibatch, positions, parameter_norms), out)
        return out

    @torch.no_grad()
    def _current_ratios(self, b: dict[str, Any]) -> torch.Tensor:
        """pi_current / pi_rollout for every stored step of the batch ``b``, back in (T, N) order (for V-trace clipping)."""
        with self._autocast():
            logits, _, _ = self.forward(b["obs"], b["states"], b["starts"], **_rows(self.grouped, b["rows"]))
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
        return {
            **({"reward_scaling": self.reward_scaler.state()} if self.reward_scaler is not None else {}),
            "global_step": self.global_step, "iteration": self.iteration, "rng": rng_states(),
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
        set_rng_states(state["rng"])

    def hyperparameters(self) -> dict:
        return asdict(self.config)


def _first_non_finite(policy: nn.Module, iteration: int, per_minibatch: dict[str, torch.Tensor],
                      positions: list[tuple[int, int]], parameter_norms: torch.Tensor) -> str:
    """Which quantity of the update went non-finite first: a loss term or the gradient of a minibatch, in
    the order they were computed, else a parameter (by name)."""
    where = f"iteration {iteration + 1}"
    names = {"pg_loss": "policy loss", "v_loss": "value loss", "entropy": "entropy", "grad_norm": "gradient norm"}
    values = {k: v.tolist() for k, v in per_minibatch.items()}
    for i, (epoch, mb) in enumerate(positions):
        for key, label in names.items():
            if not math.isfinite(values[key][i]):
                return (f"{where}, epoch {epoch + 1}, minibatch {mb + 1}: the {label} is {values[key][i]} "
                        "(the first non-finite quantity of the update)")
    named = [n for n, p in policy.named_parameters() if p.requires_grad]
    for name, norm in zip(named, parameter_norms.tolist()):
        if not math.isfinite(norm):
            return f"{where}: parameter {name!r} holds a non-finite value after the update"
    return f"{where}: a non-finite value in the update"


def _rows(grouped: bool, rows: torch.Tensor, index: Any = slice(None)) -> dict[str, torch.Tensor]:
    """The row indices ``rows[index]`` a GroupedPolicy reads each row's group from (indexed only for it); other
    policies take no such argument."""
    return {"rows": rows[index]} if grouped else {}


def rng_states() -> dict:
    """Every global generator's state (torch CPU and CUDA, NumPy, Python) as JSON-able data."""
    np_state = np.random.get_state()
    return {"torch": _b64(torch.get_rng_state()),
            "cuda": [_b64(t) for t in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
            "numpy": [np_state[0], _b64(torch.from_numpy(np_state[1].astype(np.uint32).view(np.uint8))),
                      int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]]}


def set_rng_states(rng: dict) -> None:
    """Put back ``rng_states()``'s generators (the CUDA ones where as many devices are visible)."""
    torch.set_rng_state(_unb64(rng["torch"]))
    if rng.get("cuda") and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([_unb64(t) for t in rng["cuda"]])
    name, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((name, _unb64(keys).numpy().view(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = rng["python"]
    random.setstate((version, tuple(internal), gauss_next))


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


def _explained_variance(values: torch.Tensor, returns: torch.Tensor, masks: torch.Tensor) -> float:
    y_pred, y_true = values[masks].double(), returns[masks].double()
    var_y = y_true.var() if y_true.numel() > 1 else torch.tensor(float("nan"))
    return float("nan") if not torch.isfinite(var_y) or var_y == 0 else float(1 - (y_true - y_pred).var() / var_y)
