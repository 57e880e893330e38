"""A run's learning curve, ``learning_curve.png``, drawn from its history with matplotlib (the ``[plot]``
extra): at the end of every run, and again by ``packrl plot RUN``.

matplotlib is optional. Without it a run still writes ``history.jsonl`` (every figure of every iteration),
and its closing line (``curve_line``) says how to draw the curve later. Nothing here imports torch.
"""
from __future__ import annotations

import io
import json
import math
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from packrl.printing import shown
from packrl.run_folders import write_file

INSTALL = "pip install 'packrl[plot]'"
"""How a user gets matplotlib, said wherever a curve could not be drawn for want of it."""


def matplotlib_available() -> bool:
    """Whether matplotlib imports here (an install without the ``[plot]`` extra has none)."""
    try:
        import matplotlib  # noqa: F401 - imported only to learn whether it can be
    except ImportError:
        return False
    return True


PLOT_RANGE = 1e300
"""A number plotted (a step, a return, a win rate) lies within ±PLOT_RANGE: matplotlib's axis arithmetic
overflows near float64's limit (1.8e308)."""
MAX_SERIES = 32
"""At most this many agents' return lines are drawn (the first by name); the rest are left out, said."""


def plot_learning_curve(history: list[dict], path: str | Path, title: str) -> Path | None:
    """Mean episode return per iteration against agent steps, as a PNG; None when no episode ended or when
    matplotlib is not installed (``curve_line`` tells the two apart). With several agents per env, one line per
    agent (``MAX_SERIES`` at most); in two-player games also the win rate against a random opponent (right
    axis). Non-finite values are left out of the plot (history.jsonl keeps them), as are rows ``left_out``
    names. The file is written by ``run_folders.write_file``: a symlink in its place is refused, not followed."""
    agents = sorted({k for h in history for k in h if k.startswith("episode_return/")})[:MAX_SERIES]
    series = {k.partition("/")[2]: _points(history, k) for k in agents} or {"per iteration": _points(history, "episode_return")}
    series = {name: pts for name, pts in series.items() if len(pts)}
    wins = _points(history, "vs_random/win")
    if not series and not len(wins):
        return None
    if not matplotlib_available():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = _figure(plt, series, wins, title)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    path = Path(path)
    return write_file(path.parent, path.name, png.getvalue())  # atomic, never through a symlink


def _figure(plt: Any, series: dict[str, np.ndarray], wins: np.ndarray, title: str) -> Any:
    """The curve's figure: a line per series (with its running mean when there is one), the win rate against
    random on a right axis, and one legend for both axes below them, outside the plot, so it never hides data."""
    fig, ax = plt.subplots(figsize=(6, 3.8), dpi=120, layout="constrained")
    for name, (steps, returns) in ((n, pts.T) for n, pts in series.items()):
        ax.plot(steps, returns, lw=1, alpha=0.4 if len(series) == 1 else 0.8, label=_label(name))
        window = max(1, len(returns) // 20)
        if window > 1 and len(series) == 1:
            smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], smooth, lw=2, label=f"mean of {window}")
    ax.set(xlabel="agent steps", ylabel="episode return", title=_label(title))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(wins):
        right = ax.twinx()
        right.plot(*wins.T, "k.-", lw=1, label="win rate vs random")
        right.set(ylabel="win rate vs random", ylim=(0, 1))
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(labels)), fontsize="small", frameon=False)
    return fig


def curve_line(folder: Path) -> str:
    """The run's closing line about its curve: where it is, that no episode ended, or (without matplotlib) that
    it was not drawn and the one command that draws it from the history the run wrote (control characters in
    the folder's name escaped)."""
    if not matplotlib_available():
        return shown(f"learning curve: not drawn, matplotlib is not installed (the figures are in "
                     f"{folder / 'history.jsonl'}); to draw it: {INSTALL}, then packrl plot {shlex.quote(str(folder))}")
    curve = folder / "learning_curve.png"
    return shown(f"learning curve: {curve if curve.exists() else '(no episode ended, no curve)'}")


def left_out(history: list[dict]) -> str | None:
    """What ``plot_learning_curve`` leaves out of the curve besides non-finite values, as one phrase (None when
    nothing): rows whose step or a plotted figure is not a number within ±PLOT_RANGE, and agents past
    ``MAX_SERIES``."""
    bad = [(i, why) for i, row in enumerate(history, 1) if (why := _unplottable(row)) is not None]
    agents = len({k for h in history for k in h if k.startswith("episode_return/")})
    parts = []
    if bad:
        parts.append(f"{len(bad)} of {len(history)} rows left out of the curve (row {bad[0][0]}: {bad[0][1]})")
    if agents > MAX_SERIES:
        parts.append(f"{agents - MAX_SERIES} of {agents} agents' returns left out (at most {MAX_SERIES} lines drawn)")
    return "; ".join(parts) or None


def _plotted(key: str) -> bool:
    return key in ("episode_return", "vs_random/win") or key.startswith("episode_return/")


def _number(value: Any) -> bool:
    """A JSON number that can be plotted (a non-finite float is not, but is no error: it means no data)."""
    if type(value) is int:  # math.isfinite would raise OverflowError on 10**400
        return abs(value) <= PLOT_RANGE
    return type(value) is float and (not math.isfinite(value) or abs(value) <= PLOT_RANGE)


def _unplottable(row: dict) -> str | None:
    """Why a history row cannot be plotted, or None."""
    figures = [(k, v) for k, v in row.items() if _plotted(k) and v is not None]
    if not figures:
        return None
    step = row.get("global_step")
    if not _number(step) or not math.isfinite(float(step)):
        return f"global_step {short(step)} is not a finite number within ±{PLOT_RANGE:g}"
    for key, value in figures:
        if not _number(value):
            return f"{shown(key[:80])} {short(value)} is not a number within ±{PLOT_RANGE:g}"
    return None


def _points(history: list[dict], key: str) -> np.ndarray:
    """(n, 2) array of (global_step, value) where ``key`` holds a finite number and the row is plottable."""
    pts = [(h["global_step"], h[key]) for h in history
           if _number(h.get(key)) and math.isfinite(float(h[key])) and _unplottable(h) is None]
    return np.array(pts, dtype=np.float64).reshape(-1, 2)


def _label(text: str) -> str:
    """Text for matplotlib: control characters escaped, ``$`` literal (not mathtext, whose parser raises on a
    stray one), and no leading ``_`` (which hides a legend entry)."""
    text = shown(text).replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def short(value: Any) -> str:
    """A value as shown in a message: its JSON, cut to 60 characters, control characters escaped."""
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=repr)
    return shown(text if len(text) <= 60 else text[:57] + "...")
