"""Starting Ray in tests on a busy machine.

``ray.init`` gives up when its node has not registered within 30 s ("The current node timed out during
startup"), a limit Ray hard-codes. On a 2-core machine with other CPU-bound jobs that happens now and then,
so ``start_ray`` tries again, up to RAY_START_ATTEMPTS times (about 2 minutes in all, quiet start-up being
2-4 s on the project machine), and skips the test with the reason only when Ray itself cannot start.
"""
import pytest

RAY_START_ATTEMPTS = 4


def start_ray(**options):
    """``ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, **options)``, retried; skips the
    calling test (``pytest.skip``) with Ray's own error when every attempt failed."""
    import ray

    options = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False, **options}
    error = None
    for _ in range(RAY_START_ATTEMPTS):
        try:
            return ray.init(**options)
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for a start-up timeout
            error = err
            ray.shutdown()  # whatever half-started goes before the next attempt
    pytest.skip(f"Ray could not start on this machine in {RAY_START_ATTEMPTS} attempts: "
                f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
