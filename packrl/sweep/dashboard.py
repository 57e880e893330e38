"""``packrl sweep dashboard SWEEP``: optuna-dashboard serving the sweep's study, on localhost by default."""
from __future__ import annotations

import signal
import sys
from typing import Any


def serve(storage: Any, host: str, port: int, study: str) -> int:
    """Serve optuna-dashboard until Ctrl-C or SIGTERM; the exit code."""
    from optuna_dashboard import run_server

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"optuna-dashboard: study {study} on http://{host}:{port}/dashboard/ (Ctrl-C stops)", flush=True)
    try:
        run_server(storage, host=host, port=port)
    except KeyboardInterrupt:
        return 0
    except OSError as err:
        print(f"packrl sweep dashboard: cannot serve on {host}:{port}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0
