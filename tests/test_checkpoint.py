"""Checkpoints: safetensors weights, JSON metadata readable without torch, SHA-256 checked before loading."""
import json
import subprocess
import sys

import gymnasium as gym
import pytest
import torch

from packrl.checkpoint import CheckpointError, load_checkpoint, read_metadata, save_checkpoint
from packrl.emulation import Layout


def _save(tmp_path, with_optimizer=False):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.randn(3, 4)).sum().backward()
    opt.step()
    layout = Layout.from_space(gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(-1, 1, (2,))}))
    path = save_checkpoint(tmp_path / "ckpt", net.state_dict(), config={"network": "mlp", "hidden": 8},
                           layouts={"observation": layout}, env_id="CartPole-v1", seed=7,
                           optimizer=opt.state_dict() if with_optimizer else None, global_step=123)
    return path, net, opt, layout


def test_round_trip_weights_metadata_and_optimizer(tmp_path):
    path, net, opt, layout = _save(tmp_path, with_optimizer=True)
    state, meta, opt_state = load_checkpoint(path)
    assert state.keys() == net.state_dict().keys()
    for k, v in net.state_dict().items():
        assert torch.equal(state[k], v)
    assert meta["config"] == {"network": "mlp", "hidden": 8}
    assert meta["env_id"] == "CartPole-v1" and meta["seed"] == 7 and meta["global_step"] == 123
    assert Layout.from_dict(meta["layouts"]["observation"]) == layout
    assert {"torch", "numpy", "python"} <= set(meta["packages"])
    fresh = torch.optim.Adam(net.parameters(), lr=1e-3)
    fresh.load_state_dict(opt_state)
    for a, b in zip(fresh.state_dict()["state"].values(), opt.state_dict()["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["step"], b["step"])


def test_metadata_is_read_without_importing_torch(tmp_path):
    path, *_ = _save(tmp_path)
    code = ("import sys, json; from packrl.checkpoint import read_metadata; "
            f"m = read_metadata({str(path)!r}); assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'safetensors' not in sys.modules; print(json.dumps(m['env_id']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '"CartPole-v1"'
    assert json.loads((path / "metadata.json").read_text())["sha256"] == read_metadata(path)["sha256"]


def test_tampered_weights_are_refused_before_loading(tmp_path):
    path, *_ = _save(tmp_path)
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # flip one bit of the last weight
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_checkpoint(path)


def test_tampered_metadata_hash_and_missing_files_are_refused(tmp_path):
    path, *_ = _save(tmp_path)
    meta = json.loads((path / "metadata.json").read_text())
    meta["sha256"] = "0" * 64
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="metadata.json"):
        read_metadata(tmp_path / "nothing")
    (path / "metadata.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_metadata(path)
