"""packrl train runs torch on one CPU thread unless asked: --torch-threads N, or OMP_NUM_THREADS."""
import torch

from packrl.commands.training import set_torch_threads as _set_torch_threads


def test_one_thread_by_default_and_what_is_asked_otherwise(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        _set_torch_threads(None)
        assert torch.get_num_threads() == 1
        _set_torch_threads(2)
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        _set_torch_threads(None)  # the user's environment decides
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
