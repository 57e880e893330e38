"""Evaluation: whole episodes of a vector env under a fixed policy, sampled (as trained) or greedy.

Each env plays a fixed quota of episodes (``episodes`` split evenly over the envs), and every row records
the return of each of its env's episodes up to that quota: short episodes are not over-counted, and no
partial episode is ever reported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from packrl.errors import PackrlError


class EvaluationError(PackrlError, RuntimeError):
    """An evaluation cannot report a return: a non-finite reward, or episodes that never end."""


@dataclass(frozen=True)
class Episodes:
    """An evaluation's episodes, in the same order: each return, and whether it ended by truncation (a time
    limit: a greedy policy that loops runs into it where sampling would have broken out)."""

    returns: np.ndarray
    truncated: np.ndarray


def evaluate(policy: Any, vecenv: Any, deterministic: bool = True, max_steps: int = 100_000, seed: int = 10_000,
             device: str | torch.device = "cpu", episodes: int | None = None) -> np.ndarray:
    """Episode returns, one per (row, episode): ``episodes`` whole episodes spread evenly over the envs
    (each row of an env records that env's quota), or one per row when ``episodes`` is None.
    ``deterministic`` takes the distribution's mode; otherwise actions are sampled from a generator seeded
    with ``seed`` (the global torch RNG is left as it was). A non-finite reward, or rows that have not
    finished their quota after ``max_steps`` steps, raise EvaluationError naming the row."""
    return evaluate_episodes(policy, vecenv, deterministic, max_steps, seed, device, episodes).returns


@torch.no_grad()
def evaluate_episodes(policy: Any, vecenv: Any, deterministic: bool = True, max_steps: int = 100_000,
                      seed: int = 10_000, device: str | torch.device = "cpu", episodes: int | None = None,
                      progress: Callable[[int, int], None] | None = None) -> Episodes:
    """``evaluate``, with how each episode ended. ``progress(recorded, total)``, when given, is called each time
    episodes end (``packrl eval``'s progress lines)."""
    policy = policy.to(device).eval()
    rows = vecenv.num_agents
    per_env = int(getattr(vecenv, "agents_per_env", 1))
    num_envs = rows // per_env
    if episodes is None:
        quota = np.ones(rows, dtype=np.int64)
    else:
        per = np.array([episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)], dtype=np.int64)
        quota = np.repeat(per, per_env)
    recorded: list[list[tuple[float, bool]]] = [[] for _ in range(rows)]
    totals = np.zeros(rows)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            obs, _ = vecenv.reset(seed=seed)
            state = policy.initial_state(rows, device)
            done = torch.zeros(rows, dtype=torch.bool, device=device)
            for step in range(max_steps):
                if all(len(r) >= q for r, q in zip(recorded, quota)):
                    break
                logits, _, state = policy.forward_eval(torch.as_tensor(obs).to(device), state, done)
                dist = policy.decoder.distribution(logits.float())
                action = dist.mode() if deterministic else dist.sample()
                obs, rewards, terminals, truncations, _ = vecenv.step(policy.decoder.to_numpy(action))
                rewards = np.asarray(rewards, dtype=np.float64)
                if not np.isfinite(rewards).all():
                    row = int(np.flatnonzero(~np.isfinite(rewards))[0])
                    raise EvaluationError(f"env row {row} returned reward {rewards[row]} at step {step}; "
                                          "an evaluation with a non-finite reward has no return to report")
                totals += rewards
                ended = np.asarray(terminals) | np.asarray(truncations)
                cut = np.asarray(truncations) & ~np.asarray(terminals)
                for row in np.flatnonzero(ended):
                    if len(recorded[row]) < quota[row]:
                        recorded[row].append((float(totals[row]), bool(cut[row])))
                if progress is not None and ended.any():
                    progress(sum(map(len, recorded)), int(quota.sum()))
                totals[ended] = 0.0
                done = torch.from_numpy(ended).to(device)
            else:
                missing = int(sum(max(0, q - len(r)) for r, q in zip(recorded, quota)))
                raise EvaluationError(f"{missing} episodes of {int(quota.sum())} did not finish in {max_steps} steps")
    finally:
        policy.train()
    ended = [x for r in recorded for x in r]
    return Episodes(np.array([ret for ret, _ in ended]), np.array([cut for _, cut in ended], dtype=bool))


@torch.no_grad()
def record_frames(policy: Any, vecenv: Any, deterministic: bool = True, seed: int = 10_000,
                  device: str | torch.device = "cpu", max_steps: int = 10_000) -> list[np.ndarray]:
    """The ``rgb_array`` frames of the first episode of env 0 (a serial vector env whose env renders)."""
    env = vecenv.envs[0]
    policy = policy.to(device).eval()
    frames = []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            obs, _ = vecenv.reset(seed=seed)
            state = policy.initial_state(vecenv.num_agents, device)
            done = torch.zeros(vecenv.num_agents, dtype=torch.bool, device=device)
            per_env = int(getattr(vecenv, "agents_per_env", 1))
            for _ in range(max_steps):
                frames.append(_frame(env.render()))
                logits, _, state = policy.forward_eval(torch.as_tensor(obs).to(device), state, done)
                dist = policy.decoder.distribution(logits.float())
                action = dist.mode() if deterministic else dist.sample()
                obs, _, terminals, truncations, _ = vecenv.step(policy.decoder.to_numpy(action))
                ended = np.asarray(terminals) | np.asarray(truncations)
                if ended[:per_env].all():
                    break
                done = torch.from_numpy(ended).to(device)
    finally:
        policy.train()
    return frames


def _frame(frame: Any) -> np.ndarray:
    array = np.asarray(frame)
    if array.ndim != 3 or array.shape[-1] not in (3, 4) or array.dtype != np.uint8:
        raise EvaluationError(f"env.render() returned {type(frame).__name__} of shape {array.shape} and dtype "
                              f"{array.dtype}; a video needs rgb_array frames (H, W, 3) uint8")
    return array
