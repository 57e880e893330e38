"""The policy's forms side by side on the three default tasks, whole training runs (issue 38).

Each contender trains the default policy of a task for a fixed number of iterations (rollout + update) from the
same seed, in a fresh process (imports and env construction left out of the clock, everything from ``PPO(...)``
on counted: allocation, a form's tracing, torch.compile's warm-up). Contenders (``--forms``):

- default: ``PPO`` as it is: the policy's ``step_function`` / ``forward_function`` as this tree defines them;
- modules: those two hidden, so PPO calls ``forward_eval`` and ``forward``, the plain modules;
- compile: ``PPOConfig(compile=True)`` (the minibatch loss through torch.compile; on CPU the rollout stays eager
  on the modules, as PPO runs it); its compile counts in the wall time;
- fx: a form derived mechanically from the modules, ``torch.fx.experimental.proxy_tensor.make_fx`` of
  ``forward_eval`` / ``forward`` (the aten ops they dispatch, replayed without module calls), traced once per input
  shape (counted); not for a policy that reads tensors on the host (MiniGrid's mission words).

``--tree DIR`` adds the default form of another packrl checkout (``DIR/packrl``), e.g. the commit before a change,
run the same way, so before and after stand in one run. Tasks: the gridworld, classic-control and minigrid presets
(``packrl.presets``), and ``cartpole-train.py``: benchmarks/train.py's setting (8 Numba CartPoles, 128 steps, 4x4
minibatches, 64 hidden) with its CleanRL-style loop as the anchor (issue 21's >= 4x target).
"same bits" compares each run's final weights (sha256 of the state dict's bytes) with the modules' run.

    nice -n 10 .venv/bin/python benchmarks/model_forms.py [--repeats 3] [--tree /tmp/before]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

HERE = Path(__file__).resolve()
TASKS = {  # name: (env id, backend, preset name, iterations); train.py's setting is its own (see ``_setting``)
    "cartpole": ("cartpole", "numba", "classic-control", 40),
    "gridworld": ("gridworld", "numba", "gridworld", 16),
    "minigrid": ("MiniGrid-DoorKey-5x5-v0", "serial", "minigrid", 3),
    "cartpole-train.py": ("cartpole", "numba", None, 16),
}
FORMS = ("default", "modules", "compile", "fx")
SEED = 0


# ---------------------------------------------------------------- one run (in a child process)

def _setting(task: str) -> tuple[dict, dict, int]:
    """(vec settings, policy settings, train settings) of a task: its preset's, or benchmarks/train.py's."""
    if TASKS[task][2] is None:
        from train import EPOCHS, HIDDEN, LR, MINIBATCHES, NUM_ENVS, NUM_STEPS

        return ({"num_envs": NUM_ENVS}, {"hidden": HIDDEN},
                {"num_steps": NUM_STEPS, "update_epochs": EPOCHS, "num_minibatches": MINIBATCHES, "learning_rate": LR})
    from packrl.presets import PRESETS

    preset = next(p for p in PRESETS if p.name == TASKS[task][2])
    return preset.settings["vec"], dict(preset.settings.get("policy", {})), dict(preset.settings["train"])


def fx_forms(policy):
    """``(step_function, forward_function)`` derived by make_fx from ``forward_eval`` and ``forward``: one trace
    per input shape, kept for the run (the traces hold the parameter and buffer objects themselves, which the
    optimizer updates in place, so they stay current). ``step(x, values) -> logits`` as ``Policy.step_function``
    gives it; the forward traces on the first minibatch of each shape (PPO makes its function from the batch)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    steps: dict = {}
    forwards: dict = {}

    def step_function(x):
        if x.shape not in steps:
            with torch.no_grad():
                steps[x.shape] = make_fx(lambda rows: policy.forward_eval(rows)[:2])(x)
        graph = steps[x.shape]

        def step(x, values):
            logits, value = graph(x)
            values.copy_(value.unsqueeze(-1))
            return logits
        return step

    def forward(x):
        if x.shape not in forwards:
            forwards[x.shape] = make_fx(lambda rows: policy.forward(rows)[:2])(x)
        return forwards[x.shape](x)
    return step_function, lambda x: forward


def run_one(task: str, form: str) -> dict:
    """Train ``task`` with ``form`` for the task's iterations: wall seconds from ``PPO(...)`` to the end, agent
    steps, and the sha256 of the final weights."""
    import torch

    torch.set_num_threads(1)
    env_id, backend, _, iterations = TASKS[task]
    vec, policy_settings, train = _setting(task)
    if form == "cleanrl":
        from train import cleanrl_rate

        split = cleanrl_rate(iterations * vec["num_envs"] * train["num_steps"], seed=SEED)
        return {"seconds": split.total, "steps": split.steps, "sha": "-"}
    from packrl import vector
    from packrl.env_ids import env_creator
    from packrl.models import Policy
    from packrl.train.ppo import PPO, PPOConfig

    creator, _ = env_creator(env_id)
    torch.manual_seed(SEED)
    env = vector.make(creator, vec["num_envs"], backend=backend, seed=SEED)
    overrides = {tuple(k.split("/")): v for k, v in policy_settings.pop("overrides", {}).items()} or None
    policy = Policy.from_env(env, overrides=overrides, **policy_settings)
    if form in ("modules", "compile"):
        policy.step_function = policy.forward_function = None
    elif form == "fx":
        if not all(getattr(m, "graph_safe", True) for m in policy.modules()):
            env.close()
            return {"seconds": None, "steps": 0, "sha": "n/a"}
        policy.step_function, policy.forward_function = fx_forms(policy)
    config = PPOConfig(**train, seed=SEED, device="cpu", compile=form == "compile")
    batch = vec["num_envs"] * train["num_steps"]
    start = time.perf_counter()
    ppo = PPO(env, policy, config)
    ppo.train(iterations * batch)
    seconds = time.perf_counter() - start
    env.close()
    weights = b"".join(t.detach().contiguous().numpy().tobytes() for t in policy.state_dict().values())
    return {"seconds": seconds, "steps": ppo.global_step, "sha": hashlib.sha256(weights).hexdigest()[:12]}


# ---------------------------------------------------------------- the parent: contenders interleaved

def child(task: str, form: str, tree: str | None) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, str(HERE), "--child", task, form], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{task} / {form}{f' ({tree})' if tree else ''} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def contenders(task: str, forms: list[str], tree: str | None) -> list[tuple[str, str, str | None]]:
    rows = [("cleanrl-style", "cleanrl", None)] if TASKS[task][2] is None else []
    if tree is not None:
        rows.append((f"default @ {Path(tree).name}", "default", tree))
    forms = [f for f in forms if not (TASKS[task][2] is None and f == "fx")]
    return rows + [(f, f, None) for f in forms]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {list(TASKS)}")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, of {list(FORMS)}")
    parser.add_argument("--once", default="compile,fx", help="forms run in the first repeat only (slow to warm up)")
    parser.add_argument("--tree", default=None, help="another packrl checkout whose default form runs beside")
    parser.add_argument("--child", nargs=2, metavar=("TASK", "FORM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(*args.child)))
        return
    from common import machine_line

    tasks, forms = args.tasks.split(","), args.forms.split(",")
    for name in tasks + forms:
        if name not in TASKS and name not in FORMS:
            parser.error(f"unknown task or form {name!r}; tasks {list(TASKS)}, forms {list(FORMS)}")
    plan = {task: contenders(task, forms, args.tree) for task in tasks}
    results: dict = {task: {label: [] for label, _, _ in rows} for task, rows in plan.items()}
    once = set(args.once.split(",")) if args.once else set()
    for repeat in range(args.repeats):  # interleaved, so a change of load hits every contender alike
        for task, rows in plan.items():
            for label, form, tree in rows:
                if repeat and label in once:
                    continue
                results[task][label].append(child(task, form, tree))
                print(f"run {repeat}: {task} / {label}: {results[task][label][-1]}", file=sys.stderr, flush=True)
    print(machine_line())
    print(f"whole runs from PPO(...) on (warm-up and tracing counted), seed {SEED}, torch threads 1, "
          f"{args.repeats} repeats interleaved ({', '.join(sorted(once)) or 'none'}: the first only)")
    print("ratio = steps/s over the modules' (or the CleanRL-style loop's)")
    for task, rows in results.items():
        anchor = "cleanrl-style" if "cleanrl-style" in rows else "modules"
        runs = [r for r in rows.get(anchor, []) if r["seconds"] is not None]
        base = statistics.median(r["steps"] / r["seconds"] for r in runs) if runs else None
        modules_sha = {r["sha"] for r in rows.get("modules", [])}
        env_id, backend, preset, iterations = TASKS[task]
        print(f"\n{task}: {env_id} ({backend}), {preset or 'benchmarks/train.py'} setting, {iterations} iterations")
        print(f"{'form':24} {'median s':>9} {'median steps/s':>15} {'min':>9} {'max':>9} {'ratio':>7}  same bits")
        for label, found in rows.items():
            timed = [r for r in found if r["seconds"] is not None]
            if not timed:
                print(f"{label:24} {'n/a':>9}")
                continue
            rates = [r["steps"] / r["seconds"] for r in timed]
            shas = {r["sha"] for r in timed}
            same = "-" if label == "cleanrl-style" or not modules_sha else \
                ("yes" if shas == modules_sha else f"no ({', '.join(sorted(shas))})")
            ratio = f"{statistics.median(rates) / base:6.2f}x" if base else "-"
            print(f"{label:24} {statistics.median(r['seconds'] for r in timed):9.2f} {statistics.median(rates):15,.0f} "
                  f"{min(rates):9,.0f} {max(rates):9,.0f} {ratio:>7}  {same}")


if __name__ == "__main__":
    main()
