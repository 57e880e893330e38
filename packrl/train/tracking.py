"""Run tracking on Weights & Biases: ``packrl train --track`` logs the figures TensorBoard gets (each
iteration's returns, losses, steps/s, learning rate, per-agent returns and scores against a random opponent,
under ``train/``, at the iteration's agent step) and the run's settings as the W&B config.

wandb is optional (``pip install 'packrl[wandb]'``). Everything wandb writes stays in ``RUN/wandb/``: the run,
and its cache, config, data and artifact folders (``WANDB_CACHE_DIR`` and the rest point there while the run is
tracked, so wandb-core's ``core-debug-*.log`` and ``symon-debug-*.log`` land there too, not in ``~/.cache``). Its
mode is ``WANDB_MODE`` when the user set it (one of wandb's modes, else one line, exit 2), else ``online`` only
when there are credentials (``WANDB_API_KEY`` or a ``~/.netrc`` entry for the W&B host) and that host answers
a request within PROBE_SECONDS, else ``offline``: an offline run is uploaded later with the ``wandb sync``
command its line prints (shell-quoted). Without credentials nothing is sent anywhere, not even a probe.
Start-up is bounded: a host that stops answering after the probe fails the start within INIT_SECONDS (or
``WANDB_INIT_TIMEOUT``), as one line. In a data-parallel run rank 0 alone tracks.
"""
from __future__ import annotations

import netrc
import os
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from packrl.errors import UsageError
from packrl.printing import shell_word, shown
from packrl.run_folders import inside
from packrl.train.dashboard import LOGGED, PER_AGENT, VERSUS

INSTALL = "pip install 'packrl[wandb]'"
DEFAULT_HOST = "https://api.wandb.ai"
PROBE_SECONDS = 3.0
"""How long the one request to the W&B host may take to get its first byte of answer before the run goes offline."""
INIT_SECONDS = 30.0
"""How long wandb.init may take (its ``init_timeout``) unless ``WANDB_INIT_TIMEOUT`` says otherwise."""
MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")
"""The values wandb takes for WANDB_MODE."""
FOLDERS = {"WANDB_CACHE_DIR": "cache", "WANDB_CONFIG_DIR": "config", "WANDB_DATA_DIR": "data",
           "WANDB_ARTIFACT_DIR": "artifacts"}
"""wandb's folders, each set to ``RUN/wandb/<name>`` while a run is tracked."""


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
    """Raise TrackingError, naming the extra, when wandb cannot be imported or ``WANDB_MODE`` is none of its
    modes (checked before the run folder is made)."""
    try:
        import wandb  # noqa: F401 - imported only to learn whether it can be
    except ImportError:
        raise TrackingError(f"--track logs to Weights & Biases, which is not installed: {INSTALL}") from None
    mode = os.environ.get("WANDB_MODE")
    if mode and mode not in MODES:
        raise TrackingError(f"--track: WANDB_MODE={shown(repr(mode))} is not a W&B mode; use one of {', '.join(MODES)}")


def wandb_mode(environ: dict | None = None) -> str:
    """``WANDB_MODE`` when set; else ``online`` when there are credentials and the W&B host accepts a
    connection within PROBE_SECONDS; else ``offline``."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    host = urlparse(environ.get("WANDB_BASE_URL") or DEFAULT_HOST)
    if not (environ.get("WANDB_API_KEY") or _netrc_has(host.hostname or "", environ)):
        return "offline"  # online would stop to ask for a key
    return "online" if answers(host.scheme, host.hostname or "", host.port) else "offline"


def answers(scheme: str, hostname: str, port: int | None, seconds: float = PROBE_SECONDS) -> bool:
    """Whether the host answers within ``seconds`` in all: a TCP connection, then (https) a TLS handshake or
    (http) the first byte of an answer to one HEAD request. A host that accepts and then says nothing is
    not answering."""
    deadline = time.monotonic() + seconds
    try:
        with socket.create_connection((hostname, port or (443 if scheme == "https" else 80)), timeout=seconds) as sock:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            if scheme == "https":
                with ssl.create_default_context().wrap_socket(sock, server_hostname=hostname):
                    return True
            sock.sendall(f"HEAD / HTTP/1.0\r\nHost: {hostname}\r\n\r\n".encode())
            return bool(sock.recv(1))
    except (OSError, ValueError):  # refused, unreachable, timed out, a TLS failure (ssl.SSLError is an OSError)
        return False


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
        self.saved = _point_folders(folder / "wandb")
        settings = dict(console="off", silent=True, quiet=True, disable_git=True)
        if not os.environ.get("WANDB_INIT_TIMEOUT"):
            settings["init_timeout"] = INIT_SECONDS
        try:
            self.run = wandb.init(project=tracking.project, entity=tracking.entity, name=folder.name, dir=str(folder),
                                  config=config, mode=self.mode, settings=wandb.Settings(**settings))
        except (wandb.errors.Error, ValueError, OSError) as err:  # CommError, UsageError, pydantic's ValidationError
            _restore(self.saved)
            first = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
            raise TrackingError(f"--track: W&B did not start ({self.mode}): {shown(first)}") from None
        self.folder = Path(self.run.dir).parent if self.run.dir else None  # RUN/wandb/<mode>-run-<date>-<id>

    def log(self, stats: dict) -> None:
        self.run.log({f"train/{k}": v for k, v in stats.items()  # NaN stays NaN, as TensorBoard gets it
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and self.logged(k)},
                     step=int(stats["global_step"]))

    def line(self) -> str:
        """Where the run went and, offline, how to upload it."""
        if self.mode == "offline" and self.folder is not None:
            return shown(f"tracking: W&B offline run {self.folder}; upload it with: wandb sync ") + \
                shell_word(self.folder)
        return shown(f"tracking: W&B run {self.run.url or self.run.id} ({self.mode})")

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        try:
            self.run.finish(exit_code=1 if kind is not None else self.code)
        finally:
            _restore(self.saved)


def _point_folders(base: Path) -> dict:
    """Point wandb's cache, config, data and artifact folders into ``base`` (made inside the run folder,
    never through a symlink); the previous values, for ``_restore``."""
    saved = {name: os.environ.get(name) for name in (*FOLDERS, "WANDB_SILENT")}
    for name, sub in FOLDERS.items():
        path = inside(base.parent, Path(base.name) / sub)
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    os.environ["WANDB_SILENT"] = "true"  # wandb.login's "Loaded credentials" line comes before the settings apply
    return saved


def _restore(saved: dict) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


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
    tracker = Tracker(tracking, folder, config, lambda key: key in LOGGED or key.startswith((PER_AGENT, VERSUS)))
    if console is not None:
        console.print(tracker.line(), highlight=False, soft_wrap=True, markup=False)
    return tracker
