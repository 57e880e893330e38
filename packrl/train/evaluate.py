"""Evaluation: the first episode of every row of a vector env under a fixed policy."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


@torch.no_grad()
def evaluate(policy: Any, vecenv: Any, deterministic: bool = True, max_steps: int = 100_000, seed: int = 10_000,
             device: str | torch.device = "cpu") -> np.ndarray:
    """Return of the first episode each row finishes (one episode per row, so short episodes are not
    over-counted). ``deterministic`` takes the distribution's mode instead of a sample. Rows still running
    after ``max_steps`` steps raise, naming how many: an evaluation never reports partial episodes."""
    policy = policy.to(device).eval()
    obs, _ = vecenv.reset(seed=seed)
    rows = vecenv.num_agents
    state = policy.initial_state(rows, device)
    returns, totals = np.full(rows, np.nan), np.zeros(rows)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    for _ in range(max_steps):
        logits, _, state = policy.forward_eval(torch.as_tensor(obs).to(device), state, done)
        dist = policy.decoder.distribution(logits.float())
        action = dist.mode() if deterministic else dist.sample()
        obs, rewards, terminals, truncations, _ = vecenv.step(policy.decoder.to_numpy(action))
        totals += rewards
        ended = np.asarray(terminals) | np.asarray(truncations)
        first = ended & np.isnan(returns)
        returns[first] = totals[first]
        totals[ended] = 0.0
        done = torch.from_numpy(ended).to(device)
        if not np.isnan(returns).any():
            policy.train()
            return returns
    policy.train()
    raise RuntimeError(f"{int(np.isnan(returns).sum())} of {rows} rows did not finish an episode in {max_steps} steps")
