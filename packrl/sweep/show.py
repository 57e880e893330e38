"""The results of a sweep: the best trials, the Pareto front of the return against wall time and agent steps
(cheap settings that are nearly as good), Optuna's matplotlib plots as PNG, and ``best.toml``, the best trial's
settings as a config file that ``packrl train --config best.toml`` trains with as they are."""
from __future__ import annotations

import copy
import io
import math
import warnings
from pathlib import Path
from typing import Any

from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState
from rich.table import Table

from packrl.presets import _toml
from packrl.run_folders import write_file
from packrl.sweep.space import Dimension, Space
from packrl.sweep.view import differing, fill, fmt

PLOTS = ("optimization_history", "param_importances", "slice")


def study_space(study: Any) -> Space:
    """The space a study recorded (``packrl.sweep.study.identity``)."""
    recorded = study.user_attrs["packrl"]["space"]
    dims = tuple(Dimension(d["key"], choices=tuple(d["choices"])) if "choices" in d else
                 Dimension(d["key"], d["low"], d["high"], d["scale"], (), d["integer"]) for d in recorded["dimensions"])
    return Space(dims, recorded["fixed"])


def trial_config(study: Any, trial: Any, space: Space | None = None) -> dict:
    """The full config a finished trial trained with: the study's base config, its parameters and its seed."""
    space = space or study_space(study)
    config = copy.deepcopy(study.user_attrs["packrl"]["fixed_config"])
    for section, values in space.settings_of(trial.params).items():
        config.setdefault(section, {}).update(values)
    config["train"]["seed"] = trial.user_attrs.get("seed", config["train"].get("seed", 0))
    return config


def config_toml(config: dict, header: list[str]) -> str:
    """``config`` as a TOML config file (a setting that is none is left out: TOML has no null)."""
    lines = [f"# {line}" for line in header]
    for section in ("env", "vec", "policy", "train"):
        lines.append(f"\n[{section}]")
        lines += [f"{key} = {_toml(value)}" for key, value in config.get(section, {}).items() if value is not None]
    return "\n".join(lines) + "\n"


def ranked(study: Any) -> list:
    """The complete trials, best first."""
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    return sorted(complete, key=lambda t: t.value, reverse=study.direction.name == "MAXIMIZE")


def write_best(study: Any, space: Space | None, folder: Path) -> dict | None:
    """SWEEP/best.toml from the best complete trial; ``{"number", "value", "file"}``, or None without one."""
    best = ranked(study)
    if not best:
        return None
    t = best[0]
    recorded = study.user_attrs["packrl"]
    header = [f"packrl sweep {recorded['env']}: best trial {t.number} of study {study.study_name!r}, "
              f"{recorded['objective']} = {t.value:.6g} at a budget of {recorded['budget']:,} agent steps",
              f"run folder: {t.user_attrs.get('folder', '?')}; train with: packrl train --config best.toml"]
    path = write_file(folder, "best.toml", config_toml(trial_config(study, t, space), header))
    return {"number": t.number, "value": t.value, "file": str(path)}


def pareto_front(trials: list, steps_key: str) -> list:
    """The trials no other trial beats on return (higher), wall seconds (lower) and ``steps_key`` (lower) at once."""
    points = []
    for t in trials:
        ret, wall, steps = t.user_attrs.get("return"), t.user_attrs.get("wall_seconds"), t.user_attrs.get(steps_key)
        if steps is None and steps_key == "steps_to":
            steps = t.user_attrs.get("agent_steps")  # never reached: all the steps it took
        if all(isinstance(x, (int, float)) and math.isfinite(x) for x in (ret, wall, steps)):
            points.append((t, (-ret, wall, steps)))

    def dominates(a: tuple, b: tuple) -> bool:
        return all(x <= y for x, y in zip(a, b)) and a != b

    return [t for t, p in points if not any(dominates(q, p) for _, q in points)]


def show(study: Any, folder: Path, console: Any, plots: bool = True) -> list[Path]:
    """Print the best trials and the Pareto front; write best.toml and the PNG plots (their paths)."""
    best = ranked(study)
    recorded = study.user_attrs["packrl"]
    params = differing(best) if best else []
    rows = [[str(t.number), fmt(t.value), fmt(t.user_attrs.get("return")), fmt(t.user_attrs.get("wall_seconds")),
             f"{t.user_attrs.get('agent_steps', 0):,}", *[fmt(t.params.get(p)) for p in params]] for t in best[:10]]
    console.print(fill(Table(title=f"best trials of study {study.study_name} ({recorded['objective']}, "
                                   f"{study.direction.name.lower()})", title_justify="left"),
                       ("trial", "value", "return", "wall s", "steps", *params), rows))
    steps_key = "steps_to" if recorded["objective"].startswith("steps-to") else "agent_steps"
    front = sorted(pareto_front(best, steps_key), key=lambda t: t.user_attrs["wall_seconds"])
    rows = [[str(t.number), fmt(t.user_attrs["return"]), fmt(t.user_attrs["wall_seconds"]),
             f"{t.user_attrs.get(steps_key) or t.user_attrs.get('agent_steps'):,}", fmt(t.value)] for t in front]
    pareto = fill(Table(title="Pareto front: return against wall time and " + ("steps to the threshold"
                  if steps_key == "steps_to" else "agent steps"), title_justify="left"),
                  ("trial", "return", "wall s", "steps", "value"), rows)
    console.print(pareto)
    written = write_best(study, None, folder)
    if written:
        console.print(f"best.toml: {written['file']} (packrl train --config {written['file']})", highlight=False,
                      soft_wrap=True)
    return write_plots(study, folder / "plots", front, steps_key) if plots and best else []


def write_plots(study: Any, out: Path, front: list, steps_key: str) -> list[Path]:
    """Optuna's optimization history, parameter importances and slice plots, and the Pareto front, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        for name in PLOTS:
            try:
                axes = getattr(vis, f"plot_{name}")(study)
            except (ValueError, RuntimeError):  # importances need two complete trials whose parameters vary
                continue
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            figure.set_size_inches(max(figure.get_size_inches()[0], 8), max(figure.get_size_inches()[1], 5))
            written.append(_save_png(figure, out, f"{name}.png"))
            plt.close(figure)
    trials = ranked(study)
    figure, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([t.user_attrs.get("wall_seconds") for t in trials], [t.user_attrs.get("return") for t in trials],
               c="lightgray", label="complete trials")
    ax.scatter([t.user_attrs["wall_seconds"] for t in front], [t.user_attrs["return"] for t in front], c="tab:red",
               label="Pareto front")
    for t in front:
        ax.annotate(str(t.number), (t.user_attrs["wall_seconds"], t.user_attrs["return"]))
    ax.set_xlabel("wall seconds")
    ax.set_ylabel("mean return at the end")
    ax.set_title(f"study {study.study_name}: return against wall time")
    ax.legend()
    written.append(_save_png(figure, out, "pareto.png"))
    plt.close(figure)
    return written


def _save_png(figure: Any, folder: Path, name: str) -> Path:
    """``figure`` as ``folder/name``, written as every file packrl writes (atomically, never through a symlink)."""
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=100, bbox_inches="tight")
    return write_file(folder, name, png.getvalue())

