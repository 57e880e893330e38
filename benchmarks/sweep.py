"""packrl sweep's targets (issue 39), side by side in one run:

- pruning pays: on CartPole (packrl's Numba cartpole) the median-pruned sweep and the unpruned one, same seed, same
  number of trials, spend how many agent steps in all (target: pruned <= 60% of unpruned); each sweep's best trial
  re-run on fresh seeds (``packrl train --config best.toml --seed S``), steps to a mean return of 475 (target: the
  pruned best within 20% of the unpruned best);
- search quality on Acrobot-v1 (``--acrobot``): the sweep's best against packrl's defaults, re-run on fresh seeds,
  median steps to -100.

The default is a SMOKE run, sized to finish in a few minutes on a busy 2-core machine: few trials, small budgets,
one re-run seed. Its numbers show the machinery works, not that the targets are met; the target runs are
``--trials 40 --budget 100000 --seeds 3`` (CartPole) and ``--acrobot --trials 60 --budget 200000 --seeds 3``
(about an hour of CPU each). Prints the machine line with the load.
"""
from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine_line, print_table

from packrl.sweep.objective import steps_to as objective_steps_to

ROOT = Path(__file__).resolve().parents[1]


def sweep(env: str, out: Path, trials: int, budget: int, pruner: str, objective: str, jobs: int, seed: int,
          minutes: float | None = None) -> dict:
    """Run one sweep (stopped with SIGTERM after ``minutes`` of wall time, as a user stops one: its finished trials
    stay); its wall seconds, total agent steps over its trials, best value and best.toml."""
    tic = time.perf_counter()
    sweep_ = subprocess.Popen([sys.executable, "-m", "packrl", "sweep", env, "--trials", str(trials), "--budget",
                               str(budget), "--pruner", pruner, "--objective", objective, "--jobs", str(jobs), "--seed",
                               str(seed), "--out", str(out), "--no-live"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        _, stderr = sweep_.communicate(timeout=minutes * 60 if minutes else None)
    except subprocess.TimeoutExpired:
        sweep_.send_signal(signal.SIGTERM)
        _, stderr = sweep_.communicate()
        print(f"  sweep {out.name}: stopped after {minutes:g} minutes", flush=True)
    else:
        if sweep_.returncode != 0:
            raise SystemExit(f"sweep {out.name} failed: {stderr.strip()}")
    wall = time.perf_counter() - tic
    with sqlite3.connect(out / "study.db") as db:
        steps = sum(json.loads(v) for (v,) in db.execute(
            "select value_json from trial_user_attributes where key = 'agent_steps'"))
        states = [s for (s,) in db.execute("select state from trials")]
        best_trial = db.execute("select trial_id from trial_values order by value, trial_id limit 1").fetchone()
        best_params = db.execute("select param_name, param_value, distribution_json from trial_params where "
                                 "trial_id = ? order by param_name", best_trial).fetchall() if best_trial else []
    best = (out / "best.toml").read_text().splitlines()[0] if (out / "best.toml").is_file() else "(no complete trial)"
    if best_params:  # the objectives here are steps-to: lowest is best
        best += "; searched settings: " + ", ".join(f"{name} = {_shown(value, dist)}" for name, value, dist in best_params)
    return {"wall": wall, "steps": steps, "pruned": states.count("PRUNED"), "complete": states.count("COMPLETE"),
            "best": best, "config": out / "best.toml"}


def _shown(value: float, distribution_json: str) -> str:
    """A stored Optuna parameter as the value it stands for (a categorical's choice, not its index)."""
    distribution = json.loads(distribution_json)
    if distribution.get("name") == "CategoricalDistribution":
        return repr(distribution["attributes"]["choices"][int(value)])
    return f"{value:.4g}"


def steps_to(config: Path, seed: int, threshold: float, total: int, out: Path) -> int | None:
    """Train ``config`` on ``seed`` for ``total`` steps; the agent steps at which the mean return of the last 20
    episodes first reached ``threshold`` (None: never)."""
    run = out / f"seed{seed}"
    subprocess.run([sys.executable, "-m", "packrl", "train", "--config", str(config), "--seed", str(seed),
                    "--total-steps", str(total), "--out", str(run), "--no-live"], capture_output=True, cwd=ROOT,
                   check=True)
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    return objective_steps_to(rows, threshold)  # the sweep's own rule: the mean of the last 20 episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--budget", type=int, default=30_000)
    parser.add_argument("--seeds", type=int, default=1, help="fresh seeds each best trial is re-run on")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--acrobot", action="store_true", help="the Acrobot-v1 search-quality target instead")
    parser.add_argument("--minutes", type=float, default=None,
                        help="stop each sweep (SIGTERM) after this many wall minutes: --jobs 2 for 30 is 60 CPU-minutes")
    parser.add_argument("--rerun-steps", type=int, default=None,
                        help="steps of each re-run (default: twice the budget); a re-run that never reaches the "
                             "threshold counts as this many")
    args = parser.parse_args()
    rerun = args.rerun_steps or args.budget * 2
    smoke = args.trials < 40 or args.seeds < 3
    print(("SMOKE RUN (too small to decide the targets): " if smoke else "") +
          f"{args.trials} trials x {args.budget:,} steps, {args.seeds} re-run seed(s)")
    env, threshold, objective = ("Acrobot-v1", -100.0, "steps-to:-100") if args.acrobot else \
        ("cartpole", 475.0, "steps-to:475")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pruners = ("median",) if args.acrobot else ("median", "none")
        results = {}
        for p in pruners:
            results[p] = sweep(env, tmp / p, args.trials, args.budget, p, objective, args.jobs, seed=0,
                               minutes=args.minutes)
            print(f"  sweep, pruner {p}: {results[p]['complete']} complete, {results[p]['pruned']} pruned, "
                  f"{results[p]['steps']:,} agent steps, {results[p]['wall']:.0f} s; {results[p]['best']}", flush=True)
        rows = []
        for name, r in results.items():
            reached = [steps_to(r["config"], 1000 + s, threshold, rerun, tmp / f"rerun-{name}")
                       for s in range(args.seeds)] if r["config"].is_file() else []
            print(f"  {name}: re-runs reached {threshold:g} at {reached}", flush=True)
            median = statistics.median([x if x is not None else rerun for x in reached]) if reached else None
            rows.append([f"pruner {name}", r["complete"], r["pruned"], f"{r['steps']:,}", r["wall"],
                         f"{median:,.0f}" if median is not None else "-"])
        if args.acrobot:  # packrl's defaults, re-run the same way
            defaults = tmp / "defaults.toml"
            defaults.write_text(f'[env]\nid = "{env}"\n')
            reached = [steps_to(defaults, 1000 + s, threshold, rerun, tmp / "rerun-defaults")
                       for s in range(args.seeds)]
            print(f"  packrl defaults: re-runs reached {threshold:g} at {reached}", flush=True)
            rows.append(["packrl defaults (= rl-zoo's Acrobot-v1 PPO: the discrete-control preset)", "-", "-", "-", 0.0,
                         f"{statistics.median([x or rerun for x in reached]):,.0f}"])
    print_table(f"packrl sweep on {env}: {objective}", ["sweep", "complete", "pruned", "agent steps", "wall s",
                f"median steps to {threshold:g} (re-runs)"], rows)
    if not args.acrobot:
        ratio = results["median"]["steps"] / max(results["none"]["steps"], 1)
        print(f"pruned / unpruned agent steps: {ratio:.2f} (target <= 0.60)" + (" [smoke]" if smoke else ""))
    print(machine_line(("optuna",)))


if __name__ == "__main__":
    main()
