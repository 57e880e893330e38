"""Checkpoints: safetensors weights, JSON metadata readable without torch, SHA-256 checked before loading."""
import json
import subprocess
import sys

import gymnasium as gym
import pytest
import torch

from packrl.checkpoint import CheckpointError, load_checkpoint, manifest_sha256, read_metadata, save_checkpoint
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
    meta["weights_sha256"] = "0" * 64
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="manifest"):
        load_checkpoint(path)
    meta["sha256"] = manifest_sha256(meta)  # a consistent manifest still checks the weights against it
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="does not match the metadata's weights_sha256"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="metadata.json"):
        read_metadata(tmp_path / "nothing")
    (path / "metadata.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_metadata(path)


def test_the_manifest_hash_covers_metadata_and_weights(tmp_path):
    path, *_ = _save(tmp_path)
    meta = read_metadata(path)
    assert meta["sha256"] == manifest_sha256(meta) and len(meta["weights_sha256"]) == 64
    state, _, _ = load_checkpoint(path, expected_sha256=meta["sha256"].upper())
    with pytest.raises(CheckpointError, match="expected"):
        load_checkpoint(path, expected_sha256=meta["weights_sha256"])


# ---------------------------------------------------------------- atomic saves


def _weights(value: float) -> dict:
    return {"w": torch.full((64,), value)}


def _loaded_value(path) -> float:
    state, meta, _ = load_checkpoint(path)
    assert meta["seed"] == int(state["w"][0])
    return float(state["w"][0])


@pytest.mark.parametrize("failing_call", [0, 1])
def test_a_save_interrupted_between_renames_leaves_the_previous_checkpoint(tmp_path, monkeypatch, failing_call):
    """os.replace fails on its first call (moving the old folder aside) or its second (moving the new one in):
    the previous checkpoint still loads from ``path``, and the next save completes and tidies up."""
    import os

    path = tmp_path / "ckpt"
    save_checkpoint(path, _weights(1.0), config={}, seed=1)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) - 1 == failing_call:
            raise KeyboardInterrupt  # what Ctrl-C between two steps looks like
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, _weights(2.0), config={}, seed=2)
    monkeypatch.setattr(os, "replace", real)
    assert len(calls) == failing_call + 1
    assert _loaded_value(path) == 1.0
    save_checkpoint(path, _weights(3.0), config={}, seed=3)
    assert _loaded_value(path) == 3.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


SAVER = """
import sys, torch
from packrl.checkpoint import save_checkpoint
path = sys.argv[1]
print("ready", flush=True)
for i in range(10**6):
    save_checkpoint(path, {"w": torch.full((200_000,), float(i % 50))}, config={}, seed=i % 50)
"""


def test_a_save_killed_at_any_moment_leaves_a_loadable_checkpoint(tmp_path):
    """SIGKILL a process that saves in a loop, at several moments: a checkpoint always loads, and a new
    save afterwards tidies what the killed one left."""
    import random
    import signal
    import time

    path = tmp_path / "ckpt"
    save_checkpoint(path, _weights(7.0), config={}, seed=7)
    rng = random.Random(0)
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)  # quiet: the whole test takes 6 s
        assert _loaded_value(path) in [float(i) for i in range(50)]
    save_checkpoint(path, _weights(9.0), config={}, seed=9)
    assert _loaded_value(path) == 9.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_never_writes_through_a_symlink(tmp_path):
    real = tmp_path / "real"
    save_checkpoint(real, _weights(1.0), config={}, seed=1)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(CheckpointError, match="symlink"):
        save_checkpoint(tmp_path / "link", _weights(2.0), config={}, seed=2)
    assert _loaded_value(tmp_path / "link") == 1.0  # reading follows links (model hubs' caches link files)
    (tmp_path / "linked_parent").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(CheckpointError, match="symlink"):
        save_checkpoint(tmp_path / "linked_parent" / "ckpt", _weights(2.0), config={}, seed=2)
    assert _loaded_value(real) == 1.0 and not any((tmp_path / "elsewhere").iterdir())


def test_a_folder_with_other_files_is_not_replaced(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="notes.txt"):
        save_checkpoint(tmp_path / "run", _weights(1.0), config={}, seed=1)
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_a_checkpoint_of_the_previous_format_is_refused_naming_it(tmp_path):
    """Format 2 checkpoints hold the encoder of before the fused flat read: refused by their format, with a reason."""
    from packrl.checkpoint import FORMAT
    from tests.saved_policies import save_untrained

    path = save_untrained(tmp_path / "ck")
    meta = path / "metadata.json"
    text = meta.read_text()
    assert f'"{FORMAT}"' in text
    meta.write_text(text.replace(f'"{FORMAT}"', '"packrl.checkpoint/2"'))
    with pytest.raises(CheckpointError, match="packrl.checkpoint/2.*older packrl"):
        read_metadata(path)
