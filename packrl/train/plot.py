"""A run's learning curve, ``learning_curve.png``, drawn from its history with matplotlib (the ``[plot]``
extra): at the end of every run, and again by ``packrl plot RUN``.

matplotlib is optional. Without it a run still writes ``history.jsonl`` (every figure of every iteration),
and its closing line (``curve_line``) says how to draw the curve later. Nothing here imports torch.
"""
from __future__ import annotations

import io
import math
import shlex
from pathlib import Path

import numpy as np

INSTALL = "pip install 'packrl[plot]'"
"""How a user gets matplotlib, said wherever a curve could not be drawn for want of it."""


def matplotlib_available() -> bool:
    """Whether matplotlib imports here (an install without the ``[plot]`` extra has none)."""
    try:
        import matplotlib  # noqa: F401 - imported only to learn whether it can be
    except ImportError:
        return False
    return True


def plot_learning_curve(history: list[dict], path: str | Path, title: str) -> Path | None:
    """Mean episode return per iteration against agent steps, as a PNG; None when no episode ended or when
    matplotlib is not installed (``curve_line`` tells the two apart). With several agents per env, one line per
    agent; in two-player games also the win rate against a random opponent (right axis). Non-finite values are
    left out of the plot (history.jsonl keeps them). The file is written by ``run_folders.write_file``: a
    symlink in its place is refused, not followed."""
    agents = sorted({k for h in history for k in h if k.startswith("episode_return/")})
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

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for name, (steps, returns) in ((n, pts.T) for n, pts in series.items()):
        ax.plot(steps, returns, lw=1, alpha=0.4 if len(series) == 1 else 0.8, label=name)
        window = max(1, len(returns) // 20)
        if window > 1 and len(series) == 1:
            smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], smooth, lw=2, label=f"mean of {window}")
    ax.set(xlabel="agent steps", ylabel="episode return", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    if len(wins):
        right = ax.twinx()
        right.plot(*wins.T, "k.-", lw=1, label="win rate vs random")
        right.set(ylabel="win rate vs random", ylim=(0, 1))
        right.legend(loc="lower right")
    fig.tight_layout()
    from packrl.run_folders import write_file

    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    path = Path(path)
    return write_file(path.parent, path.name, png.getvalue())  # atomic, never through a symlink


def curve_line(folder: Path) -> str:
    """The run's closing line about its curve: where it is, that no episode ended, or (without matplotlib) that
    it was not drawn and the one command that draws it from the history the run wrote."""
    if not matplotlib_available():
        return (f"learning curve: not drawn, matplotlib is not installed (the figures are in "
                f"{folder / 'history.jsonl'}); to draw it: {INSTALL}, then packrl plot {shlex.quote(str(folder))}")
    curve = folder / "learning_curve.png"
    return f"learning curve: {curve if curve.exists() else '(no episode ended, no curve)'}"


def _points(history: list[dict], key: str) -> np.ndarray:
    """(n, 2) array of (global_step, value) where ``key`` holds a finite number."""
    pts = [(h["global_step"], h[key]) for h in history
           if isinstance(h.get(key), (int, float)) and math.isfinite(h[key]) and "global_step" in h]
    return np.array(pts, dtype=np.float64).reshape(-1, 2)
