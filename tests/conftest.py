"""Shared test settings: hypothesis profiles sized for a 2-core machine, and the learning tests' torch thread."""
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
