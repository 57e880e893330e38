"""`policy.activation`: the nonlinearity of the encoder's projection and the MLP layers, relu (the default) or
tanh (the continuous-control preset: CleanRL's and SB3's networks; with relu, MountainCarContinuous settles on
standing still, benchmarks/README.md)."""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from packrl import config as settings
from packrl import presets
from packrl.emulation import Layout
from packrl.models import Policy
from packrl.models.networks import MLP, TwinMLP, activation, make_network
from packrl.train.run import build_ppo, load_policy, save

OBS = spaces.Dict({"pos": spaces.Box(-5.0, 5.0, (3,), np.float32), "vel": spaces.Box(-1.0, 1.0, (2,), np.float64)})
ACT = spaces.Box(-1.0, 1.0, (2,), np.float32)


def policy(act: str, critic: str = "shared") -> Policy:
    torch.manual_seed(0)
    return Policy.from_layouts(Layout.from_space(OBS), ACT, hidden=16, critic=critic, activation=act)


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_tanh_changes_the_nonlinearity_and_nothing_else(critic):
    """Same seed, same weights; on the same rows the relu policy's features are relu(z) and the tanh policy's
    tanh(z) of the same preactivations z (the projection applied to the encoder's flat features), in (-1, 1)."""
    relu, tanh = policy("relu", critic), policy("tanh", critic)
    for a, b in zip(relu.state_dict().values(), tanh.state_dict().values()):
        assert torch.equal(a, b)
    rows = torch.from_numpy(np.stack([Layout.from_space(OBS).pack(OBS.sample()) for _ in range(32)]))
    with torch.no_grad():
        z = relu.encoder.project[0](relu.encoder._flat(rows))
        out_relu, out_tanh = relu.encoder(rows), tanh.encoder(rows)
        assert torch.allclose(out_relu, torch.relu(z), atol=1e-6)
        assert torch.allclose(out_tanh, torch.tanh(z), atol=1e-6)
        assert out_tanh.abs().max() < 1 and (out_tanh < 0).any()
        logits_relu, _, _ = relu.forward_eval(rows, relu.initial_state(32), None)
        logits_tanh, _, _ = tanh.forward_eval(rows, tanh.initial_state(32), None)
        assert not torch.allclose(logits_relu, logits_tanh)
    assert isinstance(tanh.encoder.project[1], nn.Tanh) and isinstance(relu.encoder.project[1], nn.ReLU)


def test_networks_take_the_activation():
    x = torch.randn(5, 8)
    mlp = make_network("mlp", 8, 8, "tanh")
    assert isinstance(mlp, MLP) and isinstance(mlp.net[1], nn.Tanh)
    assert torch.allclose(mlp.step(x, ())[0], torch.tanh(mlp.net[0](x)), atol=1e-6)
    twin = TwinMLP(4, "tanh")
    y = twin.step(x, ())[0]
    assert y.shape == (2, 5, 4) and torch.allclose(y[0], torch.tanh(x[:, :4] @ twin.weight[0].T + twin.bias[0]), atol=1e-6)
    with pytest.raises(ValueError, match="unknown activation 'sigmoid'.*relu.*tanh"):
        activation("sigmoid")
    with pytest.raises(ValueError, match="unknown activation"):
        make_network("mlp", 8, 8, "gelu")


def test_the_continuous_preset_uses_tanh_and_the_setting_reaches_the_policy():
    assert presets.get("continuous-control").settings["policy"]["activation"] == "tanh"
    config, preset = settings.resolve(flags={"env": {"id": "MountainCarContinuous-v0"}, "train": {"num_steps": 8}})
    assert preset.name == "continuous-control" and config["policy"]["activation"] == "tanh"
    ppo = build_ppo(config)
    try:
        assert isinstance(ppo.policy.encoder.project[1], nn.Tanh)
    finally:
        ppo.env.close()
    config, _ = settings.resolve(flags={"env": {"id": "CartPole-v1"}})
    assert config["policy"]["activation"] == "relu"


def test_a_tanh_checkpoint_rebuilds_a_tanh_policy(tmp_path):
    """The setting travels in the checkpoint's config: the loaded policy gives the saved one's outputs."""
    config, _ = settings.resolve(flags={"env": {"id": "Pendulum-v1"}, "policy": {"activation": "tanh"},
                                        "train": {"num_steps": 16, "total_steps": 64}})
    ppo = build_ppo(config)
    history = ppo.train(64)
    path = save(ppo, config, tmp_path / "checkpoint", history)
    loaded, _, env = load_policy(path, num_envs=2, seed=3)
    try:
        rows = torch.as_tensor(env.reset(seed=3)[0])
        with torch.no_grad():
            assert isinstance(loaded.encoder.project[1], nn.Tanh)
            torch.testing.assert_close(loaded.encoder(rows), ppo.policy.encoder(rows))
    finally:
        env.close()
        ppo.env.close()
