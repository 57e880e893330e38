"""``packrl check``: what to verify before a long job, as one report that names the fault where it is.

Steps a vector env with its policy for a few steps, then runs the policy on what it saw. Every check in
CHECKS appears in the report, as ok, warn, FAIL, or skipped with the reason (a check that could not run
because an earlier one failed says which). The checks:

- the buffers' shapes and dtypes;
- every observation leaf inside its space (NaN, out of range), naming the step, the env row, the leaf and
  the value; an observation the emulator refused to pack is reported here too, not as an action failure;
- the policy reads the packed rows (a float cast before nativize fails here);
- logits as wide as the env's action layout asks, values one per row, both finite;
- reset and step return the API's values ((observation, info), 5 values, dict infos; the pre-0.26 gym API
  is named);
- sampled actions accepted by the env, with finite log-probabilities; rewards finite (a reward the emulator
  refused, NaN included, is reported here, not as an action failure); episode flags bool;
- a recurrent state reset where an episode starts (``done``), in ``forward_eval`` and ``forward``;
- padded (masked) rows kept out of the loss: changing them leaves the loss of the acting rows unchanged;
- every parameter influences the loss (a gradient that is exactly zero, or none at all because the
  parameter is detached, fails), and every gradient is finite.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from packrl.emulation.layout import Leaf
from packrl.emulation.values import format_path
from packrl.models.distributions import ActionSpec
from packrl.printing import plural
from packrl.train.run import make_policy, make_vecenv

CHECKS = (
    "observation buffer shape and dtype",
    "rewards buffer",
    "terminals buffer",
    "truncations buffer",
    "masks buffer",
    "observation leaves inside their spaces",
    "policy reads the packed rows",
    "policy output shapes",
    "policy outputs finite",
    "reset and step return the API's values",
    "sampled actions accepted by the env",
    "action log-probabilities finite",
    "rewards finite",
    "episode flags",
    "recurrent state reset at episode starts",
    "padded rows kept out of the loss",
    "every parameter influences the loss",
    "gradients finite",
)
STEP_CHECKS = ("observation leaves inside their spaces", "policy outputs finite", "action log-probabilities finite",
               "rewards finite", "episode flags")
HISTORY = 8
"""Steps of observations kept for the checks that run the policy over time (recurrent state, gradients)."""
TOLERANCE = 1e-5


@dataclass
class Report:
    """One (status, detail) per check; status is "ok", "warn", "fail" or "skip"."""

    results: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add(self, check: str, status: str, detail: str = "") -> None:
        if check not in self.results or self.results[check][0] != "fail":  # the first failure stays
            self.results[check] = (status, detail)

    @property
    def rows(self) -> list[tuple[str, str, str]]:
        order = list(CHECKS) + [c for c in self.results if c not in CHECKS]
        return [(c, *self.results[c]) for c in order if c in self.results]

    @property
    def ok(self) -> bool:
        return all(status != "fail" for status, _ in self.results.values())

    def failures(self) -> list[tuple[str, str, str]]:
        return [r for r in self.rows if r[1] == "fail"]

    def status(self, check: str) -> str:
        return self.results.get(check, ("", ""))[0]

    def finish(self, problems: dict[str, list[str]], skipped: str | None = None, seen: int | None = None) -> "Report":
        """Step problems into their checks (``seen`` steps ran); every check not reached is listed as skipped
        with the reason ``skipped``."""
        for check, found in problems.items():
            more = f" (+{len(found) - 3} more)" if len(found) > 3 else ""
            self.add(check, "fail" if found else "ok", "; ".join(found[:3]) + more if found else f"{seen} steps")
        for check in CHECKS:
            if check not in self.results:
                self.results[check] = ("skip", skipped or "not run")
        return self


def check_config(config: dict, steps: int = 64) -> int:
    """``packrl check``: the vector env and policy of ``config`` checked for ``steps`` steps, the report printed;
    0 when no check failed, else 1."""
    vecenv = make_vecenv(config, seed=int(config["train"].get("seed", 0)))
    try:
        report = check_env(vecenv, make_policy(vecenv, config["policy"]), steps=steps)
    finally:
        vecenv.close()
    print_report(report, title=f"packrl check {config['env']['id']}")
    return 0 if report.ok else 1


def check_env(vecenv: Any, policy: torch.nn.Module, steps: int = 64, device: str = "cpu") -> Report:
    report = Report()
    problems: dict[str, list[str]] = {}
    try:
        obs, _ = vecenv.reset(seed=0)
    except Exception as err:  # noqa: BLE001 - an env may raise any class: reported with its index
        return report.finish(problems, _env_failure(report, err, "reset"), 0)
    _check_buffers(vecenv, obs, report)
    n = vecenv.num_agents
    policy = policy.to(device)
    state = policy.initial_state(n, device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    # (rows, done, acting, tainted) the policy saw. A row whose observation is outside its space is reported
    # once, under the observation check, and kept out of the checks after it (tainted): its NaN outputs and
    # gradients are that fault's consequence, not faults of the policy. A recurrent row stays tainted until
    # its episode ends.
    history: list[tuple[np.ndarray, torch.Tensor, np.ndarray, np.ndarray]] = []
    recurrent = bool(state)
    tainted = np.zeros(n, dtype=bool)
    for check in STEP_CHECKS:
        problems[check] = []
    for step in range(steps):
        masks = np.asarray(vecenv.masks).copy()
        bad = _check_observations(vecenv, obs, masks, step, problems)
        tainted = bad | (tainted & ~done.cpu().numpy()) if recurrent else bad
        history = (history + [(np.array(obs, copy=True), done.clone(), masks & ~tainted, tainted.copy())])[-HISTORY:]
        try:
            with torch.no_grad():
                logits, values, state = policy.forward_eval(torch.as_tensor(obs).to(device), state, done)
        except Exception as err:  # noqa: BLE001 - an env may raise any class: reported with its index
            report.add("policy reads the packed rows", "fail", f"step {step}: {_describe(err)}")
            return report.finish(problems, f"not run: the policy failed at step {step}", step)
        if step == 0:
            report.add("policy reads the packed rows", "ok", f"{np.asarray(obs).dtype} rows {tuple(obs.shape)}")
            if not _check_outputs(vecenv, policy, logits, values, report):
                return report.finish(problems, "not run: the policy's outputs have the wrong shape", 0)
        _check_finite_outputs(logits, values, ~tainted, step, problems)
        try:
            dist = policy.decoder.distribution(logits.float())
            action = dist.sample()
            logp = dist.log_prob(action)
        except Exception as err:  # noqa: BLE001 - an env may raise any class: reported with its index
            report.add("policy output shapes", "fail", f"step {step}: the action distribution refused the logits: "
                                                       f"{_describe(err)}")
            return report.finish(problems, f"not run: no action could be sampled at step {step}", step)
        acting = torch.from_numpy(masks & ~tainted).to(logp.device)
        if not torch.isfinite(logp[acting]).all():
            rows = torch.nonzero(acting & ~torch.isfinite(logp)).flatten().tolist()
            problems["action log-probabilities finite"].append(f"step {step}, env rows {rows[:5]}: non-finite")
        try:
            obs, rewards, terminals, truncations, _ = vecenv.step(policy.decoder.to_numpy(action))
        except Exception as err:  # noqa: BLE001 - an env may raise any class: reported with its index
            return report.finish(problems, _env_failure(report, err, f"step {step}"), step)
        _check_step(np.asarray(rewards), np.asarray(terminals), np.asarray(truncations), step, problems)
        done = torch.from_numpy(np.asarray(terminals) | np.asarray(truncations)).to(device)
    report.add("reset and step return the API's values", "ok", "(observation, info) and 5 values, infos dicts")
    report.add("sampled actions accepted by the env", "ok", f"{steps} steps x {n} rows")
    report.finish(problems, seen=steps)
    with torch.random.fork_rng(devices=[]):  # the checks sample with their own seed; the caller's RNG is untouched
        _check_recurrent_reset(policy, history, device, report)
        _check_padding(policy, history, device, report)
        _check_gradients(policy, history, device, report)
    return report.finish({})


# ---------------------------------------------------------------- env side


def _env_failure(report: Report, err: Exception, when: str) -> str:
    """Report an exception from the env under the check it concerns; returns the reason later checks skip."""
    text = str(err)
    last = _last_line(text)
    index = getattr(err, "env_index", None)  # EnvError's field: the env that failed
    where = f"{when}, env {index}" if index is not None else when
    kind = getattr(err, "env_exception", None) or f"{type(err).__module__}.{type(err).__qualname__}"
    if kind == "packrl.errors.ObservationError":  # EnvError's field
        report.add("observation leaves inside their spaces", "fail",
                   f"{where}: the emulator refused the env's observation: {last}")
        return f"not run: the env's observation at {when} is outside its space"
    heading = ENV_REFUSALS.get(kind)
    if heading is not None:  # the emulator refused what the env returned: filed under what it concerns
        report.add(heading, "fail", f"{where}: {last}")
        return f"not run: the emulator refused what the env returned at {when} ({heading})"
    report.add("sampled actions accepted by the env", "fail", f"{where}: {type(err).__name__}: {last}")
    return f"not run: the env failed at {when}"


ENV_REFUSALS = {
    "packrl.emulation.step_checks.RewardError": "rewards finite",
    "packrl.emulation.step_checks.FlagError": "episode flags",
    "packrl.emulation.step_checks.ReturnShapeError": "reset and step return the API's values",
}
"""The class of the emulator's refusal (EnvError.env_exception) -> the check it fails."""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def _check_buffers(vecenv: Any, obs: np.ndarray, report: Report) -> None:
    space = vecenv.single_observation_space
    expected = (vecenv.num_agents, *space.shape)
    status = "ok" if obs.shape == expected and obs.dtype == space.dtype else "fail"
    report.add("observation buffer shape and dtype", status, f"{obs.shape} {obs.dtype}, expected {expected} {space.dtype}")
    for name, dtype in (("rewards", np.float32), ("terminals", np.bool_), ("truncations", np.bool_), ("masks", np.bool_)):
        array = getattr(vecenv, name)
        ok = array.shape == (vecenv.num_agents,) and array.dtype == dtype
        report.add(f"{name} buffer", "ok" if ok else "fail", f"{array.shape} {array.dtype}, expected "
                                                             f"({vecenv.num_agents},) {np.dtype(dtype)}")


def _check_observations(vecenv: Any, obs: np.ndarray, masks: np.ndarray, step: int, problems: dict) -> np.ndarray:
    """Report the first row outside its space, per leaf; returns the rows with any leaf outside."""
    layout = vecenv.emulated.observation
    outside = np.zeros(len(obs), dtype=bool)
    rows = np.flatnonzero(masks)
    box = layout.box
    if box is not None and obs.dtype == box.dtype and obs.shape[1:] == box.shape:  # passed through: rows are the Box
        leaves, flat = (box,), [obs[rows]]
    else:
        leaves, picked = layout.leaves, np.ascontiguousarray(obs[rows])
        flat = [picked[:, leaf.offset: leaf.offset + leaf.nbytes].view(leaf.dtype).reshape((len(rows), *leaf.shape))
                for leaf in leaves]
    for leaf, value in zip(leaves, flat):
        bad = _outside(leaf, value)
        if bad is not None:
            index, why, all_rows = bad
            outside[rows[all_rows]] = True
            problems["observation leaves inside their spaces"].append(
                f"step {step}, env row {int(rows[index])}, leaf {format_path(leaf.path)}: {why}, value "
                f"{np.array2string(np.asarray(value[index]), threshold=8)}")
    return outside


def _outside(leaf: Leaf, value: Any) -> tuple[int, str, np.ndarray] | None:
    """(first row, why, every such row) where the batch ``value`` leaves its leaf's bounds (or is
    NaN); None when all are inside."""
    v = np.asarray(value)
    if not len(v):
        return None
    per_row = lambda mask: mask.reshape(len(v), -1).any(1)  # noqa: E731
    if v.dtype.kind == "f":
        nan = per_row(np.isnan(v))
        if nan.any():
            return int(np.argmax(nan)), "NaN", nan
    bounds = leaf.bounds
    if bounds is None:
        return None
    out = per_row(bounds.mask(v.view(np.uint8) if v.dtype == np.bool_ else v))
    if not out.any():
        return None
    return int(np.argmax(out)), f"outside the bounds [{bounds.low.min()}, {bounds.high.max()}] of {leaf.space}", out


def _check_step(rewards: np.ndarray, terminals: np.ndarray, truncations: np.ndarray, step: int, problems: dict) -> None:
    if not np.isfinite(rewards).all():
        rows = np.flatnonzero(~np.isfinite(rewards))
        problems["rewards finite"].append(f"step {step}, env rows {rows[:5].tolist()}: {rewards[rows[:5]]}")
    if terminals.dtype != np.bool_ or truncations.dtype != np.bool_:
        problems["episode flags"].append(f"step {step}: dtypes {terminals.dtype}, {truncations.dtype}")


# ---------------------------------------------------------------- policy side


def _check_outputs(vecenv: Any, policy: Any, logits: torch.Tensor, values: torch.Tensor, report: Report) -> bool:
    """Logits as wide as the env's action layout asks (not what the policy's own head says), one value per row."""
    n = vecenv.num_agents
    width = ActionSpec(vecenv.emulated.action).logits_size
    problems = []
    if tuple(logits.shape) != (n, width):
        problems.append(f"logits {tuple(logits.shape)}, the action layout needs ({n}, {width})")
    if tuple(values.shape) != (n,):
        problems.append(f"values {tuple(values.shape)}, expected ({n},)")
    report.add("policy output shapes", "fail" if problems else "ok",
               "; ".join(problems) or f"logits {tuple(logits.shape)}, values {tuple(values.shape)}")
    return not problems


def _check_finite_outputs(logits: torch.Tensor, values: torch.Tensor, clean: np.ndarray, step: int,
                          problems: dict) -> None:
    bad = torch.isnan(logits).reshape(len(logits), -1).any(1) | ~torch.isfinite(values)
    bad &= torch.from_numpy(clean).to(bad.device)
    if bad.any():
        row = int(torch.nonzero(bad)[0])
        problems["policy outputs finite"].append(f"step {step}, env row {row}: logits "
                                                 f"{logits[row].tolist()[:6]}, value {float(values[row])}")


def _sequence(history: list, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(rows (B, T, nbytes), done (B, T), acting (B, T)) of the steps the policy saw; tainted row-steps (an
    observation outside its space) hold a clean row's bytes and do not act. None when none is clean."""
    x = torch.stack([torch.as_tensor(o) for o, _, _, _ in history], 1).to(device)
    done = torch.stack([d for _, d, _, _ in history], 1).to(device)
    acting = torch.stack([torch.from_numpy(m) for _, _, m, _ in history], 1).to(device)
    tainted = torch.stack([torch.from_numpy(t) for _, _, _, t in history], 1).to(device)
    if tainted.all():
        return None
    if tainted.any():
        b, t = torch.nonzero(~tainted)[0].tolist()
        x = x.clone()
        x[tainted] = x[b, t].clone()
    return x, done, acting


SKIP_TAINTED = "every row-step seen had an observation outside its space"


def _check_recurrent_reset(policy: Any, history: list, device: str, report: Report) -> None:
    """A row whose episode starts must act as from the initial state, whatever state it carried."""
    check = "recurrent state reset at episode starts"
    seq = _sequence(history[-1:], device) or _sequence(history, device)
    if seq is None:
        report.add(check, "skip", SKIP_TAINTED)
        return
    x = seq[0][:, -1]
    n = x.shape[0]
    fresh = policy.initial_state(n, device)
    if not fresh:
        report.add(check, "skip", "the network keeps no state (feedforward)")
        return
    generator = torch.Generator(device="cpu").manual_seed(0)
    carried = tuple(torch.randn(s.shape, generator=generator).to(s) for s in fresh)
    starts = torch.ones(n, dtype=torch.bool, device=device)
    with torch.no_grad():
        for name, run in (("forward_eval", lambda s, d: policy.forward_eval(x, s, d)),
                          ("forward", lambda s, d: policy.forward(x[:, None], s, None if d is None else d[:, None]))):
            logits_a, values_a, _ = run(carried, starts)
            logits_b, values_b, _ = run(fresh, None)
            gap = max(_gap(logits_a, logits_b), _gap(values_a, values_b))
            if gap > TOLERANCE:
                report.add(check, "fail", f"{name}: rows whose episode starts (done=True) still use the state they "
                                          f"carried: outputs differ from a fresh state by {gap:.3g}")
                return
    report.add(check, "ok", "forward_eval and forward start from the initial state where done")


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return float("inf")
    return float((a[finite] - b[finite]).abs().max()) if finite.any() else 0.0


def _loss(policy: Any, x: torch.Tensor, done: torch.Tensor, acting: torch.Tensor, action: Any = None
          ) -> tuple[torch.Tensor, Any]:
    """A PPO-shaped loss over the acting rows only (masked mean): log-probability, entropy and value."""
    logits, values, _ = policy.forward(x, policy.initial_state(x.shape[0], x.device), done)
    dist = policy.decoder.distribution(logits.float())
    if action is None:
        action = dist.sample()
    per_row = -dist.log_prob(action) - dist.entropy() + values.float() ** 2
    weight = acting.float()
    return (per_row * weight).sum() / weight.sum().clamp(min=1), action


def _check_padding(policy: Any, history: list, device: str, report: Report) -> None:
    """Changing the padded rows (masked: dead, absent or waiting agents) must not change the loss. Without
    masked rows, the last row stands in for one. One step only: a masked row's observation may rightly
    shape its own recurrent state for the turns it acts later."""
    check = "padded rows kept out of the loss"
    seq = _sequence(history[-1:], device) or _sequence(history, device)
    if seq is None:
        report.add(check, "skip", SKIP_TAINTED)
        return
    x, done, acting = (part[:, -1:] for part in seq)
    padded = ~acting
    stand_in = ""
    if not padded.any():
        if x.shape[0] < 2:
            report.add(check, "skip", "one row and no masked rows: no row to pad")
            return
        acting = acting.clone()
        acting[-1] = False
        padded = ~acting
        stand_in = " (no masked rows: the last row stood in for one)"
    if not acting.any():
        report.add(check, "skip", "no acting rows in the steps seen")
        return
    source = torch.nonzero(acting)[0]
    changed = x.clone()
    changed[padded] = x[source[0], source[1]]  # valid rows of the env, unlike random bytes
    if torch.equal(changed, x):
        changed[padded] = x[padded].flip(0)
    torch.manual_seed(0)
    with torch.no_grad():
        before, action = _loss(policy, x, done, acting)
        after, _ = _loss(policy, changed, done, acting, action)
    gap = float((before - after).abs())
    if not gap <= TOLERANCE * (1 + float(before.abs())):
        report.add(check, "fail", f"changing only the padded rows changed the loss of the acting rows by {gap:.3g}"
                                  f"{stand_in}: they leak in (a statistic over the batch, such as batch norm?)")
    else:
        report.add(check, "ok", f"{plural(int(padded.sum()), 'padded row-step')}{stand_in}")


def _check_gradients(policy: Any, history: list, device: str, report: Report) -> None:
    """One loss over the steps seen (several, so recurrent weights get a gradient too): every trainable
    parameter must get a gradient that is not exactly zero, and every gradient must be finite."""
    seq = _sequence(history, device)
    if seq is None:
        for check in ("every parameter influences the loss", "gradients finite"):
            report.add(check, "skip", SKIP_TAINTED)
        return
    x, done, acting = seq
    if not acting.any():
        acting = torch.ones_like(acting)
    policy.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    loss, _ = _loss(policy, x, done, acting)
    loss.backward()
    params = [(name, p) for name, p in policy.named_parameters() if p.requires_grad]
    detached = [name for name, p in params if p.grad is None]
    zero = [name for name, p in params if p.grad is not None and not bool(p.grad.any())]
    bad = [name for name, p in params if p.grad is not None and not torch.isfinite(p.grad).all()]
    faults = ([f"no gradient (detached or unused): {', '.join(detached[:4])}" + _more(detached)] if detached else []) + \
             ([f"gradient exactly zero (multiplied by zero, or fed only zeros): {', '.join(zero[:4])}" + _more(zero)]
              if zero else [])
    report.add("every parameter influences the loss", "fail" if faults else "ok",
               "; ".join(faults) or f"{len(params)} tensors, {x.shape[1]} steps x {x.shape[0]} rows")
    report.add("gradients finite", "fail" if bad else "ok", f"non-finite: {', '.join(bad[:4])}{_more(bad)}" if bad else "")
    policy.zero_grad(set_to_none=True)


def _more(names: list) -> str:
    return f" (+{len(names) - 4} more)" if len(names) > 4 else ""


def _describe(err: Exception) -> str:
    return f"{type(err).__name__}: {_last_line(str(err))}"


def print_report(report: Report, title: str = "packrl check") -> None:
    """The report as a table; every value is escaped, so text such as ``[nan nan]`` prints as it is."""
    table = Table(title=escape(title))
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    style = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]",
             "skip": "[dim]skipped[/dim]"}
    for check, status, detail in report.rows:
        table.add_row(escape(check), style[status], escape(detail))
    Console().print(table)
    failed = report.failures()
    if failed:
        Console().print(f"[red]{plural(len(failed), 'check')} failed[/red]: " + escape(", ".join(c for c, _, _ in failed)))
