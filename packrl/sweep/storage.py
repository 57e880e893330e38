"""The study database: SQLite inside the sweep folder by default, or any database URL Optuna's RDBStorage takes
(PostgreSQL lets sweeps on several machines share one study). A URL's password is never shown: ``masked``
replaces it wherever a URL is printed or written."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from packrl.errors import ConfigError

CONNECT_SECONDS = 10
"""A database that has not answered by then is refused."""
CREATE_ATTEMPTS = 5
"""Tries at a new database's tables while another sweep makes them too."""
HEARTBEAT_SECONDS = 5
GRACE_SECONDS = 20
"""A running trial whose sweep sent no heartbeat for this long (a sweep killed on another machine) is marked
failed by the next sweep of the study that looks."""
STORAGE_ENV = "PACKRL_SWEEP_STORAGE"
"""How a sweep hands its database URL to its trial processes (not on their command line, which others can read)."""


class StorageError(ConfigError):
    """A database URL that is malformed or does not answer."""


def sqlite_url(folder: Path) -> str:
    """The sweep folder's own database, ``FOLDER/study.db``; StorageError where that name is a symlink (SQLite
    would write the study, and its journal, wherever it points)."""
    path = Path(folder).resolve() / "study.db"
    if path.is_symlink():
        raise StorageError(f"{path}: is a symlink; a sweep keeps its study database in its own folder and never "
                           "writes through a symlink")
    return f"sqlite:///{path}"


def masked(url: str) -> str:
    """``url`` with its password replaced by ***."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: show no part of it that could hold a password
        return url.split("://", 1)[0] + "://***" if "://" in url else "***"


def password(url: str) -> str | None:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).password
    except Exception:  # noqa: BLE001 - no readable URL, no password to hide
        return None


def scrub(text: str, url: str) -> str:
    """``text`` with the URL and its password replaced (a driver's error message may quote either)."""
    secret = password(url)
    text = text.replace(url, masked(url))
    return text.replace(secret, "***") if secret else text


def open_storage(url: str, heartbeat: bool = False) -> Any:
    """Optuna's RDBStorage on ``url``, connected (tables made when new); a URL that does not answer within
    CONNECT_SECONDS, or that SQLAlchemy cannot read, is one StorageError line with the password masked.
    ``heartbeat``: trials record heartbeats, so a sweep's cut trials can be found by other sweeps."""
    import optuna

    url = with_driver(url)
    engine: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        engine["connect_args"] = {"timeout": 60}  # several trial processes write one file: wait for its lock
    elif url.startswith("postgresql"):
        engine["connect_args"] = {"connect_timeout": CONNECT_SECONDS}
    extra = {"heartbeat_interval": HEARTBEAT_SECONDS, "grace_period": GRACE_SECONDS} if heartbeat else {}
    try:
        for attempt in range(CREATE_ATTEMPTS):
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=engine, **extra)
            except Exception as err:
                if not _made_at_once(err) or attempt == CREATE_ATTEMPTS - 1:
                    raise
                time.sleep(1.0)  # the other sweep's tables and types are there a moment later
    except Exception as err:  # noqa: BLE001 - SQLAlchemy, the driver and Optuna each raise their own
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StorageError(scrub(f"--storage {masked(url)}: the database does not answer ({type(err).__name__}: "
                                 f"{first})", url)) from None


def _made_at_once(error: BaseException) -> bool:
    """Whether ``error`` is a new database's schema made by two sweeps at once: the later one fails on a table
    (UniqueViolation, DuplicateTable) or an enum type (DuplicateObject: 'type "studydirection" already
    exists') that the other has just made."""
    text = type(error).__name__ + " " + str(error)
    return any(word in text for word in ("UniqueViolation", "DuplicateObject", "DuplicateTable", "already exists"))


def with_driver(url: str) -> str:
    """A ``postgresql://`` URL names the driver the sweep extra installs (psycopg2): SQLAlchemy 2.1's default for a
    bare ``postgresql://`` is psycopg 3."""
    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare):
            return "postgresql+psycopg2://" + url[len(bare):]
    return url


def child_environment(url: str) -> dict:
    """The environment of a trial process: the database URL, and one thread for every math library unless the
    sweep's own environment sets OMP_NUM_THREADS (the thread policy of ``train``, ``eval`` and ``check``:
    ``packrl.torch_threads.apply_torch_threads``)."""
    env = dict(os.environ)
    env[STORAGE_ENV] = url
    threads = env.get("OMP_NUM_THREADS") or "1"
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[name] = threads
    return env
