"""Shared test settings: hypothesis profiles sized for a 2-core machine, the learning tests' torch thread, and
a Ray runtime that survives a slow start (``tests/ray_start.py``)."""
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))



@pytest.fixture
def one_torch_thread():
    """Learning tests train on one torch thread (the CLI's default; threads wait for each other on a busy
    machine), and give the others back."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ray_runtime():
    """A local Ray runtime (2 CPUs) for the module, started with retries (``tests.ray_start.start_ray``:
    skipped with the reason only when Ray itself cannot start), stopped after it."""
    import ray

    from tests.ray_start import start_ray

    start_ray()
    yield
    ray.shutdown()

