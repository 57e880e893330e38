"""Run tracking on Weights & Biases: ``packrl train --track`` logs the figures TensorBoard gets (each
iteration's returns, losses, steps/s, learning rate, per-agent returns and scores against a random opponent,
under ``train/``, at the iteration's agent step) and the run's settings as the W&B config.

wandb is optional (``pip install 'packrl[wandb]'``). The run is written under ``RUN/wandb/``. Its mode is
``WANDB_MODE`` when the user set it, else ``online`` only when there are credentials (``WANDB_API_KEY`` or a
``~/.netrc`` entry for the W&B host) and that host answers, else ``offline``: an offline run is uploaded
later with ``wandb sync RUN/wandb/offline-run-*``. Without credentials nothing is sent anywhere, not even a
probe. In a data-parallel run rank 0 alone tracks.
"""
from __future__ import annotations

import netrc
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from packrl.errors import UsageError

INSTALL = "pip install 'packrl[wandb]'"
DEFAULT_HOST = "https://api.wandb.ai"
PROBE_SECONDS = 3.0
"""How long the one connection attempt to the W&B host may take before the run goes offline."""


class TrackingError(UsageError):
    """--track asked for what cannot be had (wandb not installed, a bad project name): exit status 2."""


@dataclass(frozen=True)
class Tracking:
    """Where a tracked run goes: ``project`` and ``entity`` (your W&B user or team; None: your default)."""

    project: str = "packrl"
    entity: str | None = None

    def __post_init__(self) -> None:
        for flag, value in (("--wandb-project", self.project), ("--wandb-entity", self.entity)):
            if value is not None and (not value.strip() or any(c in value for c in "/\\#?%:") or len(value) > 128):
                raise TrackingError(f"{flag} {value!r}: a W&B {flag[8:]} name is 1 to 128 characters without / \\ # ? % :")


def require_wandb() -> None:
    """Raise TrackingError, naming the extra, when wandb cannot be imported."""
    try:
        import wandb  # noqa: F401 - imported only to learn whether it can be
    except ImportError:
        raise TrackingError(f"--track logs to Weights & Biases, which is not installed: {INSTALL}") from None


def wandb_mode(environ: dict | None = None) -> str:
    """``WANDB_MODE`` when set; else ``online`` when there are credentials and the W&B host accepts a
    connection within PROBE_SECONDS; else ``offline``."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    host = urlparse(environ.get("WANDB_BASE_URL") or DEFAULT_HOST)
    if not (environ.get("WANDB_API_KEY") or _netrc_has(host.hostname or "", environ)):
        return "offline"  # online would stop to ask for a key
    try:
        socket.create_connection((host.hostname, host.port or (443 if host.scheme == "https" else 80)),
                                 timeout=PROBE_SECONDS).close()
    except OSError:
        return "offline"
    return "online"


def _netrc_has(hostname: str, environ: Any) -> bool:
    path = environ.get("NETRC") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(hostname) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class Tracker:
    """One W&B run for one packrl run (``with Tracker(...) as t: t.log(stats)``); ``code`` is the run's exit
    code, recorded when it finishes (an exception leaving the block records 1)."""

    def __init__(self, tracking: Tracking, folder: Path, config: dict, logged: Any):
        require_wandb()
        import wandb

        self.logged = logged  # key -> whether it is logged (the dashboard's choice for TensorBoard)
        self.mode = wandb_mode()
        self.code = 0
        self.run = wandb.init(project=tracking.project, entity=tracking.entity, name=folder.name, dir=str(folder),
                              config=config, mode=self.mode,
                              settings=wandb.Settings(console="off", silent=True, disable_git=True))
        self.folder = Path(self.run.dir).parent if self.run.dir else None  # RUN/wandb/<mode>-run-<date>-<id>

    def log(self, stats: dict) -> None:
        self.run.log({f"train/{k}": v for k, v in stats.items()  # NaN stays NaN, as TensorBoard gets it
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and self.logged(k)},
                     step=int(stats["global_step"]))

    def line(self) -> str:
        """Where the run went and, offline, how to upload it."""
        if self.mode == "offline" and self.folder is not None:
            return f"tracking: W&B offline run {self.folder}; upload it with: wandb sync {self.folder}"
        return f"tracking: W&B run {self.run.url or self.run.id} ({self.mode})"

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.run.finish(exit_code=1 if kind is not None else self.code)


class Untracked:
    """What ``start`` gives without ``--track``: logs nothing."""

    code = 0

    def log(self, stats: dict) -> None:
        pass

    def __enter__(self) -> Untracked:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def start(tracking: Tracking | None, folder: Path, config: dict, console: Any = None) -> Tracker | Untracked:
    """The run's tracker (its line printed on ``console``), or an Untracked when ``tracking`` is None."""
    if tracking is None:
        return Untracked()
    from packrl.train.dashboard import LOGGED, PER_AGENT, VERSUS

    tracker = Tracker(tracking, folder, config, lambda key: key in LOGGED or key.startswith((PER_AGENT, VERSUS)))
    if console is not None:
        console.print(tracker.line(), highlight=False, soft_wrap=True, markup=False)
    return tracker
