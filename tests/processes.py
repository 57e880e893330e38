"""Whether a worker process is still running, for the tests that kill or lose workers and actors."""


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (killed, not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
