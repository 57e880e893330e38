"""What a rollout must not train on: a NaN or infinite reward (any row) or observation (a row that acted on it)."""
from __future__ import annotations

from typing import Any

import torch

from packrl.nativize import torch_dtype
from packrl.train.storage import RolloutStorage


def first_non_finite_env_value(storage: RolloutStorage, env: Any, iteration: int) -> str | None:
    """The first non-finite reward or acting observation of the rollout in ``storage``, as one line naming its
    step, env row and leaf; None when all is finite (one host sync then)."""
    T, num_rows = storage.num_steps, storage.num_rows
    rewards = storage.rewards
    checks = [("reward", ~torch.isfinite(rewards), rewards, list(range(num_rows)))]
    for name, values, rows in _float_observation_leaves(storage.obs, env, num_rows):
        bad = ~torch.isfinite(values).reshape(T, len(rows), -1).all(-1)
        checks.append((f"observation leaf {name}", _scatter_rows(bad, rows, num_rows) & storage.masks, values, rows))
    if not bool(torch.stack([bad.any() for _, bad, _, _ in checks]).any()):
        return None
    firsts = []
    for what, bad, values, rows in checks:
        if bool(bad.any()):
            t, row = (int(i) for i in torch.nonzero(bad)[0])  # row-major: the earliest step first
            held = values[t, rows.index(row)].reshape(-1)
            firsts.append((t, row, what, float(held[~torch.isfinite(held)][0])))
    t, row, what, value = min(firsts)
    env_index = row // getattr(env, "agents_per_env", 1)
    return (f"iteration {iteration}, rollout step {t}: env row {row} (env {env_index}) gave a non-finite {what}: "
            f"{value} (the first non-finite value of the rollout)")


def _float_observation_leaves(obs: torch.Tensor, env: Any, num_rows: int) -> list[tuple[str, torch.Tensor, list[int]]]:
    """(leaf name, (T, rows, ...) typed view of the stored observations, rows) for every float leaf."""
    if obs.dtype != torch.uint8:  # a Box observation passed through as it is
        return [("(the Box observation)", obs, list(range(num_rows)))] if obs.is_floating_point() else []
    emulated = getattr(env, "emulated", None)
    if emulated is None:
        return []
    leaves = []
    described = len(emulated.row_group)  # rows of one env (vector backends) or of all envs (Numba)
    for group in emulated.groups:
        rows = sorted(e * described + r for e in range(max(num_rows // described, 1)) for r in group.rows)
        for leaf in group.observation.leaves:
            if leaf.dtype.kind == "f" and leaf.nbytes:
                view = obs[..., leaf.offset:leaf.offset + leaf.nbytes]
                if rows != list(range(num_rows)):
                    view = view[:, rows]
                name = f"{leaf.name} (agent group {group.index})" if emulated.heterogeneous else leaf.name
                leaves.append((name, view.view(torch_dtype(leaf.dtype)), rows))
    return leaves


def _scatter_rows(bad: torch.Tensor, rows: list[int], num_rows: int) -> torch.Tensor:
    if len(rows) == num_rows and rows == list(range(num_rows)):
        return bad
    full = torch.zeros((bad.shape[0], num_rows), dtype=torch.bool, device=bad.device)
    full[:, rows] = bad
    return full
