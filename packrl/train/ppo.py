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
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from packrl.errors import PackrlError
from packrl.nativize import torch_dtype
from packrl.train.advantage import compute_advantages, cut_pending_decisions


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


@dataclass
class PPOConfig:
    """Hyperparameters, with CleanRL's names and defaults (Atari/CartPole PPO)."""

    num_steps: int = 128  # rollout length per row
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    vtrace: bool = False  # importance-clip the advantages (rho/c) with the current policy each epoch
    rho_clip: float = 1.0
    c_clip: float = 1.0
    bootstrap_truncation: bool = True  # False ORs truncation into termination (the common bug), for ablations
    bptt_horizon: int | None = None  # recurrent segment length (default: num_steps)
    bf16: bool = False  # bfloat16 autocast for forward passes
    compile: bool = False  # torch.compile the policy's forward passes
    seed: int = 0
    device: str = "auto"  # "auto": cuda when present, else cpu

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


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

    def step(self, rewards: np.ndarray, ended: np.ndarray, acted: np.ndarray) -> None:
        self.returns += rewards
        self.lengths += acted
        if ended.any():
            for row in np.flatnonzero(ended):
                self.finished.append((float(self.returns[row]), int(self.lengths[row]), int(row)))
            self.returns[ended] = 0.0
            self.lengths[ended] = 0

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

    def __init__(self, vecenv: Any, policy: nn.Module, config: PPOConfig | None = None):
        self.env, self.config = vecenv, config or PPOConfig()
        cfg = self.config
        self.device = cfg.resolve_device()
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        torch.manual_seed(cfg.seed)
        self.policy = policy.to(self.device)
        if self.world > 1:  # every rank starts from rank 0's weights
            for p in self.policy.state_dict().values():
                dist.broadcast(p.data, src=0)
        self.optimizer = _adam(self.policy.parameters(), cfg.learning_rate)
        self.forward_eval = torch.compile(policy.forward_eval) if cfg.compile else policy.forward_eval
        self.forward = torch.compile(policy.forward) if cfg.compile else policy.forward
        self.recurrent = len(policy.initial_state(1, self.device)) > 0
        self.horizon = (cfg.bptt_horizon or cfg.num_steps) if self.recurrent else 1
        if cfg.num_steps % self.horizon:
            raise ValueError(f"num_steps={cfg.num_steps} must be a multiple of bptt_horizon={self.horizon}")
        self.num_rows = vecenv.num_agents
        self.global_step = 0  # agent steps (acting rows) summed over ranks
        self.iteration = 0
        self.episodes = EpisodeTracker(self.num_rows, row_agents(vecenv))
        self._allocate_storage()
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
        self._slots["start"][T] = True
        self.state = self.policy.initial_state(self.num_rows, self.device)
        self.episodes = EpisodeTracker(self.num_rows, self.episodes.agents)  # no half episode is counted

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
        self.actions: Any = None  # allocated on the first step, from the decoder's action form
        self.logprobs = torch.zeros((T, N), device=dev)
        self.values = torch.zeros((T, N), device=dev)
        self.final_values = torch.zeros((T, N), device=dev)
        self.segment_states: list = []  # recurrent state at the start of each bptt segment
        # Per-step views, made once: indexing a tensor costs about as much as the small copies themselves.
        self._step_views = [(self._slots["obs"][t], self._slots["start"][t], self.logprobs[t], self.values[t])
                            for t in range(T)]
        self._action_views: list = []
        if dev.type == "cpu":
            # On CPU the env's arrays are written through numpy views of the storage (a numpy copy of a
            # few rows costs a fraction of a torch copy_).
            self._numpy = {k: v.numpy() for k, v in self._slots.items()}
        else:
            # Pinned host staging so host -> GPU copies overlap with the policy.
            self._numpy = None
            self._host = {k: torch.zeros(v.shape[1:], dtype=v.dtype, pin_memory=True) for k, v in self._slots.items()}

    def _put(self, t: int, name: str, array: np.ndarray) -> None:
        """Write an env array into slot ``t`` of storage ``name``. On CUDA through a pinned buffer with a
        non-blocking copy: the buffer is rewritten only on the next step, after ``to_numpy`` has
        synchronised the stream."""
        if self._numpy is not None:
            self._numpy[name][t] = array
        else:
            self._slots[name][t].copy_(self._host[name].copy_(torch.from_numpy(np.asarray(array))), non_blocking=True)

    def _store_actions(self, t: int, action: Any) -> None:
        if self.actions is None:
            T = self.config.num_steps
            alloc = lambda a: torch.zeros((T, *a.shape), dtype=a.dtype, device=self.device)  # noqa: E731
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
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16)

    @torch.no_grad()
    def collect(self) -> dict[str, float]:
        """Fill storage with ``num_steps`` steps of every row."""
        env, decoder, T = self.env, self.policy.decoder, self.config.num_steps
        start_time = time.perf_counter()
        for slots in (self._slots["obs"], self._slots["mask"], self._slots["start"]):
            slots[0].copy_(slots[T])  # where the previous rollout (or the reset) left off
        self.segment_states = []
        recurrent, autocast = self.recurrent, self.config.bf16
        numpy_masks = self._numpy["mask"] if self._numpy is not None else None
        for t in range(T):
            obs_t, start_t, logprob_t, value_t = self._step_views[t]
            if recurrent and t % self.horizon == 0:
                self.segment_states.append(tuple(s.clone() for s in self.state))
            if autocast:
                with self._autocast():
                    logits, value, self.state = self.forward_eval(obs_t, self.state, start_t)
            else:
                logits, value, self.state = self.forward_eval(obs_t, self.state, start_t)
            dist_ = decoder.distribution(logits.float())
            if hasattr(dist_, "sample_with_log_prob"):
                action, logprob = dist_.sample_with_log_prob()
            else:  # a user decoder's own distribution
                action = dist_.sample()
                logprob = dist_.log_prob(action)
            logprob_t.copy_(logprob)
            value_t.copy_(value.reshape(-1))
            self._store_actions(t, action)

            # the rows that acted on this step's observation
            acting = numpy_masks[t] if numpy_masks is not None else env.masks.copy()
            obs, rewards, terminals, truncations, _ = env.step(decoder.to_numpy(action))
            terminals, truncations = np.asarray(terminals), np.asarray(truncations)
            self._put(t, "reward", rewards)
            self._put(t, "terminal", terminals)
            self._put(t, "truncation", truncations)
            ended = np.logical_or(terminals, truncations)
            self.episodes.step(rewards, ended, acting)
            if truncations.any() and (truncated := np.flatnonzero(truncations & ~terminals)).size:
                self.final_values[t] = 0.0
                self.final_values[t, truncated] = self._final_values(env.final_observations[truncated], truncated)
            self._put(t + 1, "obs", obs)
            self._put(t + 1, "mask", env.masks)
            self._put(t + 1, "start", ended)
        with self._autocast():
            _, next_value, _ = self.forward_eval(self._slots["obs"][T], self.state, self._slots["start"][T])
        self.next_value = next_value.float().reshape(-1)
        # rows waiting for their turn after the rollout: their pending decision waits for the next rollout's data
        self.train_masks, self.train_rewards, self.bootstrap_value = cut_pending_decisions(
            self.values, self.rewards, self.terminals, self.truncations, self.masks, self.next_value,
            self._slots["mask"][T])
        self._check_env_values()
        acted = int(self.masks.sum())
        acted = _all_sum(acted, self.device) if self.world > 1 else acted
        self.global_step += acted
        return {"rollout_seconds": time.perf_counter() - start_time, "agent_steps": acted}

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

    def _final_values(self, final_obs: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """V(final observation) of rows that truncated, from the state that saw their episode."""
        x = torch.as_tensor(np.ascontiguousarray(final_obs)).to(self.device)
        idx = torch.from_numpy(rows).to(self.device)
        state = tuple(s[idx] for s in self.state)
        with self._autocast():
            _, value, _ = self.forward_eval(x, state, None)
        return value.float().reshape(-1)

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

    def update(self) -> dict[str, float]:
        cfg = self.config
        start_time = time.perf_counter()
        advantages, returns = self.advantages()
        masks = self.train_masks
        b_obs, b_masks, b_starts = self._segments(self.obs), self._segments(masks), self._segments(self.starts)
        b_logprobs = self._segments(torch.where(masks, self.logprobs, 0.0))
        b_values = self._segments(torch.where(masks, self.values, 0.0))
        b_actions = ({k: self._segments(v) for k, v in self.actions.items()} if isinstance(self.actions, dict)
                     else self._segments(self.actions))
        b_states = tuple(torch.stack(parts).reshape(-1, *parts[0].shape[1:]) for parts in zip(*self.segment_states))
        num_segments = b_obs.shape[0]
        minibatch = max(num_segments // cfg.num_minibatches, 1)

        # With no masked row in the rollout (single-agent envs), masked means are plain means: one host
        # sync here saves a where and a division in every mean of every minibatch.
        all_acting = bool(masks.all())
        # Statistics stay tensors until the end: one host sync per update, not one per minibatch.
        stats: dict[str, list] = {k: [] for k in ("pg_loss", "v_loss", "entropy", "grad_norm")}
        positions: list[tuple[int, int]] = []  # (epoch, minibatch) of each entry of stats
        kl_parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # (logratio, mask) of each minibatch
        params = [p for p in self.policy.parameters() if p.requires_grad]
        for epoch in range(cfg.update_epochs):
            if cfg.vtrace and epoch > 0:
                advantages, returns = self.advantages(self._current_ratios(b_obs, b_states, b_starts, b_actions, b_logprobs))
            b_advantages, b_returns = self._segments(advantages), self._segments(returns)
            order = torch.randperm(num_segments, device=self.device)
            for first in range(0, num_segments, minibatch):
                positions.append((epoch, first // minibatch))
                mb = order[first:first + minibatch]
                if all_acting:
                    mask, masked_mean = None, torch.mean
                else:
                    mask = b_masks[mb]
                    count = mask.sum().clamp(min=1).float()
                    masked_mean = lambda x: torch.where(mask, x, 0.0).sum() / count  # noqa: E731 - masked rows weigh nothing

                # episode starts matter only to recurrent state (the MLP ignores them)
                mb_states, mb_starts = (tuple(s[mb] for s in b_states), b_starts[mb]) if self.recurrent else ((), None)
                if cfg.bf16:
                    with self._autocast():
                        logits, newvalue, _ = self.forward(b_obs[mb], mb_states, mb_starts)
                else:
                    logits, newvalue, _ = self.forward(b_obs[mb], mb_states, mb_starts)
                dist_ = self.policy.decoder.distribution(logits.float())
                newlogprob = dist_.log_prob(_index(b_actions, mb))
                entropy = dist_.entropy()
                logratio = newlogprob - b_logprobs[mb]
                newvalue = newvalue.float()
                if newvalue.shape != logratio.shape:
                    newvalue = newvalue.reshape(logratio.shape)
                if mask is not None:
                    logratio = torch.where(mask, logratio, 0.0)
                ratio = logratio.exp()
                kl_parts.append((logratio.detach(), mask))

                mb_advantages = b_advantages[mb]
                if cfg.norm_adv:
                    if all_acting:
                        # unbiased, as the masked form; one element has std 0 there (torch.std gives NaN)
                        mean = mb_advantages.mean()
                        std = mb_advantages.std() if mb_advantages.numel() > 1 else torch.zeros_like(mean)
                    else:
                        mean = masked_mean(mb_advantages)
                        std = (masked_mean((mb_advantages - mean) ** 2) * count / (count - 1).clamp(min=1.0)).sqrt()
                    mb_advantages = (mb_advantages - mean) / (std + 1e-8)

                # Policy loss
                neg_advantages = -mb_advantages
                pg_loss1 = neg_advantages * ratio
                pg_loss2 = neg_advantages * torch.clamp(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)
                pg_loss = masked_mean(torch.max(pg_loss1, pg_loss2))

                # Value loss
                mb_returns = b_returns[mb]
                if cfg.clip_vloss:
                    mb_values = b_values[mb]
                    v_loss_unclipped = (newvalue - mb_returns) ** 2
                    v_clipped = mb_values + torch.clamp(newvalue - mb_values, -cfg.clip_coef, cfg.clip_coef)
                    v_loss_clipped = (v_clipped - mb_returns) ** 2
                    v_loss = 0.5 * masked_mean(torch.max(v_loss_unclipped, v_loss_clipped))
                else:
                    v_loss = 0.5 * masked_mean((newvalue - mb_returns) ** 2)

                entropy_loss = masked_mean(entropy)
                loss = pg_loss - cfg.ent_coef * entropy_loss + v_loss * cfg.vf_coef

                for p in params:  # optimizer.zero_grad(set_to_none=True) without its profiler record per call
                    p.grad = None
                loss.backward()
                if self.world > 1:
                    _average_gradients(self.policy)
                grad_norm = _clip_grad_norm(params, cfg.max_grad_norm)
                self.optimizer.step()
                stats["pg_loss"].append(pg_loss.detach())
                stats["v_loss"].append(v_loss.detach())
                stats["entropy"].append(entropy_loss.detach())
                stats["grad_norm"].append(grad_norm)

            if cfg.target_kl is not None and _kl_statistics(kl_parts, cfg.clip_coef)["approx_kl"].item() > cfg.target_kl:
                break

        per_minibatch = {k: torch.stack(v) for k, v in stats.items()}
        parameter_norms = torch.stack(torch._foreach_norm(params)) if params else torch.zeros(0, device=self.device)
        out = {k: v.mean() for k, v in per_minibatch.items()}
        out.update(_kl_statistics(kl_parts, cfg.clip_coef))
        out["all_finite"] = torch.isfinite(torch.cat([v.float() for v in (*per_minibatch.values(), parameter_norms)])).all()
        out = {k: v.item() for k, v in out.items()}
        out["explained_variance"] = _explained_variance(self.values, returns, masks)
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
    def _current_ratios(self, b_obs: torch.Tensor, b_states: tuple, b_starts: torch.Tensor, b_actions: Any,
                        b_logprobs: torch.Tensor) -> torch.Tensor:
        """pi_current / pi_rollout for every stored step, back in (T, N) order (for V-trace clipping)."""
        with self._autocast():
            logits, _, _ = self.forward(b_obs, b_states, b_starts)
        logratio = self.policy.decoder.distribution(logits.float()).log_prob(b_actions) - b_logprobs
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


def _adam(params: Any, lr: float) -> torch.optim.Optimizer:
    """Adam with CleanRL's eps; the fused kernel (CPU and CUDA) when this torch has it."""
    params = list(params)
    try:
        return _FusedAdam(params, lr=lr, eps=1e-5, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, eps=1e-5)


class _FusedAdam(torch.optim.Adam):
    """``torch.optim.Adam(fused=True)`` whose ``step()`` calls the fused kernel directly once its state
    exists: the same ``_foreach_add_`` of the step counts and the same ``_fused_adam_`` call with the
    same arguments as torch's own path (tested bit for bit against it), without the per-step grouping
    of tensors and hooks around it, which cost a small network more than the update itself. Anything
    outside the plain case (several groups or devices, a missing gradient, amsgrad, weight decay,
    hooks) takes torch's own ``step``."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        fast = self._fast_lists() if closure is None else None
        if fast is None:
            return super().step(closure)
        params, grads, exp_avgs, exp_avg_sqs, steps = fast
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        torch._foreach_add_(steps, 1)
        try:
            torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                               beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"], maximize=False,
                               grad_scale=None, found_inf=None)
        except (TypeError, RuntimeError):
            # a torch whose private kernel takes other arguments: undo the count, use torch's own step for good
            torch._foreach_sub_(steps, 1)
            self._direct = False
            return super().step(closure)
        return None

    def _fast_lists(self) -> tuple | None:
        if not getattr(self, "_direct", True) or len(self.param_groups) != 1 or self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks:
            return None
        group = self.param_groups[0]
        if group["amsgrad"] or group["weight_decay"] or group["maximize"] or group.get("decoupled_weight_decay") \
                or isinstance(group["lr"], torch.Tensor) or not hasattr(torch, "_fused_adam_"):
            return None
        params = group["params"]
        grads = [p.grad for p in params]
        if any(g is None or g.is_sparse for g in grads):
            return None
        cache = getattr(self, "_packrl_state_lists", None)
        # the state lists hold until load_state_dict or add_param_group replaces the state or the params
        if cache is None or cache[0] is not self.state or cache[1] is not params:
            states = [self.state.get(p) for p in params]
            if any(not st or "exp_avg" not in st for st in states):
                return None  # the first step creates the state through torch's path
            if len({(p.device, p.dtype) for p in params} | {(g.device, g.dtype) for g in grads}) != 1:
                return None
            cache = self._packrl_state_lists = (self.state, params, [st["exp_avg"] for st in states],
                                                [st["exp_avg_sq"] for st in states], [st["step"] for st in states])
        return params, grads, cache[2], cache[3], cache[4]


def _clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``nn.utils.clip_grad_norm_`` (same norm, same 1e-6, same clamp at 1) for parameters that share one
    device and dtype, without its per-call grouping of tensors (which costs more than the clipping of
    a small network). Returns the norm before clipping (0 without gradients)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else "cpu")
    if len({(g.device, g.dtype) for g in grads}) > 1:
        return nn.utils.clip_grad_norm_(params, max_norm).float()
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


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
        dims = tuple(range(1, logratio.ndim))
        if mask is None:
            mean = lambda x: x.mean(dims)  # noqa: E731 - per minibatch
        else:
            count = mask.sum(dims).clamp(min=1)
            mean = lambda x: torch.where(mask, x, 0.0).sum(dims) / count  # noqa: E731 - per minibatch
        ratio = logratio.exp()
        per["old_approx_kl"].append(mean(-logratio))
        per["approx_kl"].append(mean((ratio - 1) - logratio))
        per["clipfrac"].append(mean(((ratio - 1.0).abs() > clip_coef).float()))
    return {k: torch.cat(v).mean() for k, v in per.items()}


def _index(actions: Any, idx: torch.Tensor) -> Any:
    return {k: v[idx] for k, v in actions.items()} if isinstance(actions, dict) else actions[idx]


def _explained_variance(values: torch.Tensor, returns: torch.Tensor, masks: torch.Tensor) -> float:
    y_pred, y_true = values[masks].double(), returns[masks].double()
    var_y = y_true.var() if y_true.numel() > 1 else torch.tensor(float("nan"))
    return float("nan") if not torch.isfinite(var_y) or var_y == 0 else float(1 - (y_true - y_pred).var() / var_y)


def _average_gradients(module: nn.Module) -> None:
    """One all-reduce over all gradients flattened together (DDP's effect, without wrapping the
    policy: PPO calls ``forward_eval`` and ``forward``, which DDP's hooks on ``__call__`` would miss)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _all_sum(value: int, device: torch.device) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return int(t.item())

