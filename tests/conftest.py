"""Shared test settings: hypothesis profiles sized for a 2-core machine, the learning tests' torch thread, and
one Ray runtime per pytest process that survives a slow start (``tests/ray_start.py``)."""
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))



@pytest.fixture(scope="session", autouse=True)
def sb3_logs_stay_in_the_test_folder(tmp_path_factory):
    """Stable-Baselines3 makes a log folder for every model, ``$TMPDIR/SB3-<time>`` unless ``SB3_LOGDIR`` names
    one (even at verbose 0): a test writes only inside pytest's temporary folders."""
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3_logs"))
    yield
    os.environ.pop("SB3_LOGDIR", None)

@pytest.fixture
def one_torch_thread():
    """Learning tests train on one torch thread (the CLI's default; threads wait for each other on a busy
    machine), and give the others back."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray runtime (2 CPUs) per pytest process, shared by every module that uses Ray (``make test``'s
    xdist workers each have their own), started with retries (``tests.ray_start.start_ray``: one slow start
    per run, not one per module), stopped at the end of the session."""
    import ray

    from tests.ray_start import start_ray

    start_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_runtime(ray_session):
    """The session's Ray runtime for a module: started again if a test before shut it down, and restarted if
    actors a module before left behind still hold its CPUs (the next module's actors would wait for them)."""
    import ray

    from tests.ray_start import start_ray

    if ray.is_initialized() and not _cpus_free(ray):
        ray.shutdown()
    start_ray()
    yield


def _cpus_free(ray, wait: float = 10.0) -> bool:
    """Whether every CPU of the runtime is free, within ``wait`` seconds (actors release theirs as they exit)."""
    import time

    deadline = time.monotonic() + wait
    while True:
        if ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
