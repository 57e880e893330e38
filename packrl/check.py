"""``packrl check``: what to verify before a long job, as one report.

Steps a vector env with its policy for a few steps and checks: buffer shapes and dtypes, every observation
leaf inside its space (range, NaN), rewards finite, episode flags well formed, the policy's logits and
values shaped and finite, sampled actions accepted by the env with finite log-probabilities, and one
PPO-style backward pass reaching every parameter with a finite gradient.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from packrl.emulation.values import format_path


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (check, "ok" | "warn" | "fail", detail)

    def add(self, check: str, status: str, detail: str = "") -> None:
        self.rows.append((check, status, detail))

    @property
    def ok(self) -> bool:
        return all(status != "fail" for _, status, _ in self.rows)

    def failures(self) -> list[tuple[str, str, str]]:
        return [r for r in self.rows if r[1] == "fail"]


def check_env(vecenv: Any, policy: torch.nn.Module, steps: int = 64, device: str = "cpu") -> Report:
    report = Report()
    obs, _ = vecenv.reset(seed=0)
    _check_buffers(vecenv, obs, report)
    state = policy.initial_state(vecenv.num_agents, device)
    problems: dict[str, list[str]] = {}
    done = torch.zeros(vecenv.num_agents, dtype=torch.bool)
    for step in range(steps):
        _check_observations(vecenv, obs, step, problems)
        with torch.no_grad():
            logits, values, state = policy.forward_eval(torch.as_tensor(obs).to(device), state, done)
        if step == 0:
            _check_outputs(vecenv, logits, values, report)
        dist = policy.decoder.distribution(logits.float())
        action = dist.sample()
        logp = dist.log_prob(action)
        masks = np.asarray(vecenv.masks)
        if not torch.isfinite(logp[torch.from_numpy(masks)]).all():
            problems.setdefault("action log-probabilities", []).append(f"step {step}: non-finite for acting rows")
        try:
            obs, rewards, terminals, truncations, _ = vecenv.step(policy.decoder.to_numpy(action))
        except Exception as err:  # report the env's own refusal, naming the step
            report.add("sampled actions accepted by the env", "fail", f"step {step}: {type(err).__name__}: {err}")
            return _finish(report, problems)
        _check_step(rewards, terminals, truncations, step, problems)
        done = torch.from_numpy(np.asarray(terminals) | np.asarray(truncations))
    report.add("sampled actions accepted by the env", "ok", f"{steps} steps x {vecenv.num_agents} rows")
    _check_gradients(policy, obs, device, report)
    return _finish(report, problems)


def _finish(report: Report, problems: dict[str, list[str]]) -> Report:
    for check in ("observation leaves inside their spaces", "rewards finite", "episode flags",
                  "action log-probabilities"):
        found = problems.get(check, [])
        report.add(check, "fail" if found else "ok", "; ".join(found[:3]) + (f" (+{len(found) - 3} more)" if len(found) > 3 else ""))
    return report


def _check_buffers(vecenv: Any, obs: np.ndarray, report: Report) -> None:
    space = vecenv.single_observation_space
    expected = (vecenv.num_agents, *space.shape)
    status = "ok" if obs.shape == expected and obs.dtype == space.dtype else "fail"
    report.add("observation buffer shape and dtype", status, f"{obs.shape} {obs.dtype}, expected {expected} {space.dtype}")
    for name, dtype in (("rewards", np.float32), ("terminals", np.bool_), ("truncations", np.bool_), ("masks", np.bool_)):
        array = getattr(vecenv, name)
        ok = array.shape == (vecenv.num_agents,) and array.dtype == dtype
        report.add(f"{name} buffer", "ok" if ok else "fail", f"{array.shape} {array.dtype}")


def _check_observations(vecenv: Any, obs: np.ndarray, step: int, problems: dict) -> None:
    layout = vecenv.emulated.observation
    rows = np.flatnonzero(np.asarray(vecenv.masks))
    if obs.dtype == np.uint8 and layout.nbytes <= obs.shape[-1]:
        leaves = layout.leaves
        values = [_leaf_values(layout, obs[rows, : layout.nbytes], i) for i in range(len(leaves))]
    else:  # a pass-through Box observation: the rows are the leaf itself
        leaves, values = layout.leaves[:1], [obs[rows]]
    for leaf, value in zip(leaves, values):
        message = _outside(leaf.space, value)
        if message:
            problems.setdefault("observation leaves inside their spaces", []).append(
                f"step {step}, leaf {format_path(leaf.path)}: {message}")


def _leaf_values(layout: Any, rows: np.ndarray, index: int) -> np.ndarray:
    flat = _flatten(layout.unpack(rows))
    return flat[index]


def _flatten(tree: Any) -> list:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _flatten(v)]
    if isinstance(tree, tuple):
        return [x for v in tree for x in _flatten(v)]
    return [tree]


def _outside(space: spaces.Space, value: Any) -> str:
    """Why the batch ``value`` is not inside ``space`` ('' when it is)."""
    if isinstance(space, spaces.Box):
        v = np.asarray(value)
        if v.dtype.kind == "f" and np.isnan(v).any():
            return "NaN"
        with np.errstate(invalid="ignore"):
            low_bad, high_bad = v < space.low, v > space.high
        if low_bad.any() or high_bad.any():
            bad = v[low_bad | high_bad]
            return f"{bad.size} values outside [{space.low.min()}, {space.high.max()}], e.g. {bad.reshape(-1)[0]}"
        return ""
    if isinstance(space, spaces.Discrete):
        v = np.asarray(value)
        bad = (v < space.start) | (v >= space.start + space.n)
        return f"{int(bad.sum())} values outside [{space.start}, {space.start + space.n})" if bad.any() else ""
    if isinstance(space, spaces.MultiDiscrete):
        v = np.asarray(value)
        bad = (v < space.start) | (v >= space.start + space.nvec)
        return f"{int(bad.sum())} values outside their nvec" if bad.any() else ""
    return ""


def _check_outputs(vecenv: Any, logits: torch.Tensor, values: torch.Tensor, report: Report) -> None:
    n = vecenv.num_agents
    ok = logits.shape[0] == n and values.shape == (n,)
    report.add("policy output shapes", "ok" if ok else "fail", f"logits {tuple(logits.shape)}, values {tuple(values.shape)}")
    finite = bool(torch.isfinite(values).all()) and not bool(torch.isnan(logits).any())
    report.add("policy outputs finite", "ok" if finite else "fail", "logits not NaN, values finite")


def _check_step(rewards: np.ndarray, terminals: np.ndarray, truncations: np.ndarray, step: int, problems: dict) -> None:
    if not np.isfinite(rewards).all():
        rows = np.flatnonzero(~np.isfinite(rewards))
        problems.setdefault("rewards finite", []).append(f"step {step}, rows {rows[:5].tolist()}: {rewards[rows[:5]]}")
    if terminals.dtype != np.bool_ or truncations.dtype != np.bool_:
        problems.setdefault("episode flags", []).append(f"step {step}: dtypes {terminals.dtype}, {truncations.dtype}")


def _check_gradients(policy: torch.nn.Module, obs: np.ndarray, device: str, report: Report) -> None:
    """One loss touching every head: log-prob, entropy and value. Parameters without a gradient are
    reported (they never learn), as are non-finite gradients."""
    policy.zero_grad(set_to_none=True)
    x = torch.as_tensor(obs).to(device)
    logits, values, _ = policy.forward(x[:, None], policy.initial_state(x.shape[0], device))
    dist = policy.decoder.distribution(logits.float())
    action = dist.sample()
    loss = -(dist.log_prob(action)).mean() - dist.entropy().mean() + (values.float() ** 2).mean()
    loss.backward()
    missing = [name for name, p in policy.named_parameters() if p.requires_grad and p.grad is None]
    bad = [name for name, p in policy.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    report.add("gradients reach every parameter", "warn" if missing else "ok",
               f"no gradient: {missing[:4]}" if missing else f"{sum(1 for _ in policy.parameters())} tensors")
    report.add("gradients finite", "fail" if bad else "ok", f"non-finite: {bad[:4]}" if bad else "")
    policy.zero_grad(set_to_none=True)


def print_report(report: Report, title: str = "packrl check") -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    style = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}
    for check, status, detail in report.rows:
        table.add_row(check, style[status], detail)
    Console().print(table)
