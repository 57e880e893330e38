"""One source per setting (issue 38): PPO's help is TRAIN_FIELDS alone, a policy setting's default is
PolicyConfig's alone (``make_policy`` and ``Policy.from_env`` take the typed config), every recorded value of a
checkpoint is checked by the same Setting that checks flags and files; and the training run is written over a
process group that has a single-process form."""
import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from packrl import config as settings_module
from packrl.checkpoint import CheckpointError
from packrl.config import TRAIN_FIELDS, PolicyConfig, settings
from packrl.errors import ConfigError
from packrl.hyperparameters import PPOConfig

ROOT = Path(__file__).resolve().parents[1]


def test_every_ppo_setting_takes_its_help_and_range_from_train_fields():
    names = [f.name for f in dataclasses.fields(PPOConfig)]
    assert sorted(set(names) - set(TRAIN_FIELDS)) == []  # a new PPOConfig field needs its help here
    assert sorted(set(TRAIN_FIELDS) - set(names)) == []
    for name in names:
        setting = settings()[f"train.{name}"]
        assert (setting.help, setting.range) == TRAIN_FIELDS[name], name
    assert "tokenize" not in Path(settings_module.__file__).read_text()  # no help scraped from comments


def test_policy_from_env_writes_no_default_of_its_own():
    from packrl.models import Policy

    params = inspect.signature(Policy.from_env).parameters
    names = {f.name for f in dataclasses.fields(PolicyConfig)}
    assert not names & set(params)  # network, hidden, ... come through the typed config (or **settings)
    assert "config" in params


@pytest.fixture(scope="module")
def cartpole():
    import gymnasium as gym

    from packrl import vector

    env = vector.make(lambda: gym.make("CartPole-v1"), 2, backend="serial")
    yield env
    env.close()


def test_make_policy_and_from_env_build_the_same_policy_from_the_typed_config(cartpole):
    import torch

    from packrl.models import Policy
    from packrl.train.run import make_policy

    typed = PolicyConfig(hidden=24, network="gru", activation="tanh")
    torch.manual_seed(0)
    a = make_policy(cartpole, typed).state_dict()
    torch.manual_seed(0)
    b = make_policy(cartpole, {"hidden": 24, "network": "gru", "activation": "tanh"}).state_dict()
    torch.manual_seed(0)
    c = Policy.from_env(cartpole, hidden=24, network="gru", activation="tanh").state_dict()
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    default = Policy.from_env(cartpole).state_dict()
    assert default["encoder.project.0.weight"].shape[0] == PolicyConfig().hidden


@pytest.mark.parametrize("section, expected", [
    ({"hidden": 0}, "policy.hidden = 0: expected an int in [1, 16384]"),
    ({"network": "transformer"}, "policy.network = 'transformer': expected one of mlp, lstm, gru, mingru"),
    ({"critic": "separate", "network": "lstm"}, "policy.critic = 'separate' needs policy.network = 'mlp'"),
    ({"widht": 3}, "unknown key policy.widht"),
])
def test_make_policy_checks_a_section_as_a_config_file_is_checked(cartpole, section, expected):
    from packrl.train.run import make_policy

    with pytest.raises(ConfigError) as err:
        make_policy(cartpole, section)
    assert expected in str(err.value)


@pytest.mark.parametrize("key, value, expected", [
    ("activation", "gelu", "expected one of relu, tanh"),  # no hand check named it before
    ("log_std_init", 3.0, "expected a float in [-5, 2]"),
    ("overrides", {"a": "os:system"}, "'leaf/path' = one of"),
    ("squash_actions", 1, "expected true or false"),
])
def test_a_recorded_policy_value_is_refused_by_its_setting(key, value, expected, tmp_path):
    from packrl.train.checkpoint_env import checked_config

    metadata = {"config": {"env": {"id": "CartPole-v1"}, "policy": {key: value}}}
    with pytest.raises(CheckpointError) as err:
        checked_config(metadata, tmp_path / "metadata.json")
    assert f"field 'config.policy.{key}'" in str(err.value) and expected in str(err.value)
    json.dumps(checked_config({"config": {"env": {"id": "CartPole-v1"}, "policy": {}}}, tmp_path))  # defaults fill


def test_a_single_process_is_a_group_of_one_whose_collectives_give_back_what_they_get():
    from packrl.train.distributed import Group, join

    group = join(5.0)
    assert isinstance(group, Group) and (group.rank, group.world, group.main) == (0, 1, True)
    assert group.broadcast_text("x") == "x" and group.gather_text("y") == ["y"] and group.sum([1, 2.5]) == [1.0, 2.5]
    assert group.on_ranks([0]) == "" and group.resume_command == "packrl train"
    assert not group.collective_error(RuntimeError("Connection reset by peer"))  # no collective ran: the run's own
    group.barrier()
    group.close()


def test_no_training_code_tests_for_a_missing_group():
    for name in ("session.py", "run.py"):
        text = (ROOT / "packrl" / "train" / name).read_text()
        assert "group is None" not in text and "group is not None" not in text, name
