"""Presets: chosen from the env id, every value a checked setting, the gridworld one equal to the demo's
settings, the CartPole one equal to rl-zoo's, precedence defaults < preset < file < flags, and
discoverable (packrl configs, packrl train --help, the line at train start)."""
from pathlib import Path

import pytest

from packrl import presets
from packrl.cli import build_parser, config_from_args, main, normalize_argv
from packrl.config import check_layer, settings
from packrl.errors import ConfigError
from packrl.train.run import merge_config

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def parsed(argv):
    return config_from_args(build_parser().parse_args(normalize_argv(argv)))


def test_presets_are_chosen_from_the_env_id():
    expected = {
        "gridworld": "gridworld", "cartpole": "classic-control", "CartPole-v1": "classic-control",
        "CartPole-v0": "classic-control", "MiniGrid-DoorKey-5x5-v0": "minigrid", "BabyAI-GoToLocal-v0": "babyai",
        "minigrid:MiniGrid-Empty-5x5-v0": "minigrid", "pettingzoo.classic.tictactoe_v3": "pettingzoo-classic",
        "pettingzoo.classic.connect_four_v3": "pettingzoo-classic",
        "pettingzoo.butterfly.knights_archers_zombies_v11": "parallel-multiagent",
        "pettingzoo.sisl.pursuit_v4": "parallel-multiagent", "mpe2.simple_adversary_v3": "parallel-multiagent",
        "mpe2.simple_tag_v3": "simple-spread", "simple_tag": "simple-spread",
        "mpe2.simple_spread_v3": "simple-spread", "simple_spread": "simple-spread",
        "Pendulum-v1": "pendulum", "MountainCarContinuous-v0": "continuous-control", "HalfCheetah-v5": "continuous-control",
        "my_envs:make": None, "Acrobot-v1": "discrete-control", "MountainCar-v0": "discrete-control",
    }
    for env_id, name in expected.items():
        preset = presets.for_env(env_id)
        assert (preset.name if preset else None) == name, env_id


@pytest.mark.parametrize("preset", presets.PRESETS, ids=presets.names())
def test_every_preset_value_is_a_checked_setting(preset):
    checked = check_layer(preset.settings, f"preset {preset.name}")
    for key, value in preset.items():
        section, name = key.split(".")
        assert checked[section][name] == value and type(checked[section][name]) is type(value), key
    assert preset.source and preset.summary and preset.patterns


def test_gridworld_preset_is_exactly_the_demo():
    """The settings examples/train_demo.py used to spell out (it now runs `packrl train gridworld`, this preset),
    which are known to reach the 0.8 pass mark."""
    demo = {"vec": {"backend": "numba", "num_envs": 32}, "policy": {"network": "mlp", "hidden": 64},
            "train": {"num_steps": 32, "learning_rate": 2e-3, "ent_coef": 0.01, "update_epochs": 4,
                      "num_minibatches": 4, "gamma": 0.95}}
    assert presets.get("gridworld").settings == demo
    assert "packrl train gridworld" in (ROOT / "examples" / "train_demo.py").read_text()
    config, preset = parsed(["train", "gridworld"])
    assert preset.name == "gridworld" and config["train"]["learning_rate"] == 2e-3 and config["vec"]["num_envs"] == 32


def test_classic_control_is_rl_zoo_cartpole():
    zoo = {"n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
           "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2}
    s = presets.get("classic-control").settings
    assert s["vec"]["num_envs"] == zoo["n_envs"]
    train = s["train"]
    assert train["num_steps"] == zoo["n_steps"]
    assert train["num_minibatches"] == zoo["n_envs"] * zoo["n_steps"] // zoo["batch_size"] == 1
    assert (train["gae_lambda"], train["gamma"], train["update_epochs"], train["ent_coef"], train["learning_rate"],
            train["clip_coef"]) == (zoo["gae_lambda"], zoo["gamma"], zoo["n_epochs"], zoo["ent_coef"],
                                    zoo["learning_rate"], zoo["clip_range"])
    assert train["anneal_lr"] is True  # zoo's lin_1e-3


def test_precedence_defaults_preset_file_flags(tmp_path):
    default_steps = settings()["train.num_steps"].default
    config, preset = parsed(["train", "my_envs:make"])  # no preset names it
    assert preset is None and "num_steps" not in config["train"] and default_steps == 128
    config, preset = parsed(["train", "CartPole-v1"])
    assert preset.name == "classic-control" and config["train"]["num_steps"] == 32
    assert config["train"]["update_epochs"] == 20 and config["policy"]["hidden"] == 64
    path = tmp_path / "c.toml"
    path.write_text("[train]\nnum_steps = 64\n")
    config, _ = parsed(["train", "CartPole-v1", "--config", str(path)])
    assert config["train"]["num_steps"] == 64 and config["train"]["update_epochs"] == 20
    config, _ = parsed(["train", "CartPole-v1", "--config", str(path), "--train.num_steps", "16"])
    assert config["train"]["num_steps"] == 16
    config, preset = parsed(["train", "CartPole-v1", "--preset", "none"])
    assert preset is None and "num_steps" not in config["train"] and config["policy"]["hidden"] == 128
    config, preset = parsed(["train", "CartPole-v1", "--preset", "minigrid"])
    assert preset.name == "minigrid" and config["train"]["num_steps"] == 128 and config["vec"]["num_envs"] == 16
    path.write_text('[env]\nid = "gridworld"\n')  # the env id of the file picks the preset too
    config, preset = parsed(["train", "--config", str(path)])
    assert preset.name == "gridworld" and config["vec"]["backend"] == "numba"
    with pytest.raises(ConfigError, match="unknown preset 'zoo'; presets: gridworld"):
        parsed(["train", "CartPole-v1", "--preset", "zoo"])


def test_packrl_configs_lists_every_preset_and_prints_each_as_toml(capsys):
    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    for preset in presets.PRESETS:
        assert f"{preset.name}: {preset.summary}" in out and preset.source in out
        for key, value in preset.items():
            assert f"{key}={value}" in out
    for preset in presets.PRESETS:
        assert main(["configs", preset.name]) == 0
        parsed_toml = tomllib.loads(capsys.readouterr().out)
        assert parsed_toml == preset.settings  # the printed file sets exactly the preset
        merged = merge_config(parsed_toml)
        for key, value in preset.items():
            section, name = key.split(".")
            assert merged[section][name] == value
    assert main(["configs", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err


def test_train_shows_its_preset_at_the_start(tmp_path, capsys):
    rc = main(["train", "cartpole", "--total-steps", "256", "--no-live", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0 and out.splitlines()[0].startswith("preset: classic-control (")
    rc = main(["train", "cartpole", "--preset", "none", "--total-steps", "256", "--no-live", "--out", str(tmp_path / "r2")])
    assert rc == 0 and capsys.readouterr().out.splitlines()[0].startswith("preset: none for 'cartpole'")


def test_the_config_lists_exactly_the_encoders_the_models_build():
    from packrl.config import LEAF_ENCODERS
    from packrl.models.encoders import CHOICES

    assert LEAF_ENCODERS == (*CHOICES, "drop")


def test_an_unknown_gymnasium_id_with_box_actions_gets_the_continuous_preset():
    """No pattern names it: its action space (a Dict holding a Box) chooses continuous-control; Discrete actions
    with a flat Box observation choose discrete-control (issue 42: Acrobot's defaults), with an image Box nothing,
    and a module:function id is never made to look."""
    import gymnasium as gym
    import numpy as np

    class Reach(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Dict({"move": gym.spaces.Box(-1, 1, (2,), np.float32), "grip": gym.spaces.Discrete(2)})

    class Pick(Reach):
        action_space = gym.spaces.Discrete(3)

    class Look(Pick):
        observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)

    gym.register("PackrlReach-v0", entry_point=Reach)
    gym.register("PackrlPick-v0", entry_point=Pick)
    gym.register("PackrlLook-v0", entry_point=Look)
    try:
        assert presets.for_env("PackrlReach-v0").name == "continuous-control"
        assert presets.for_env("PackrlPick-v0").name == "discrete-control"
        assert presets.for_env("PackrlLook-v0") is None
        assert presets.for_env("tests.nowhere:PackrlReach-v0") is None
    finally:
        del gym.registry["PackrlReach-v0"], gym.registry["PackrlPick-v0"], gym.registry["PackrlLook-v0"]
