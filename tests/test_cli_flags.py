"""Every config setting through the command line and a config file: good values land typed, bad values are one
line on stderr and exit status 2, never a traceback. The table is built from the settings themselves
(packrl.config.settings(), which reads PPOConfig's fields), so a new field is walked too."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from packrl import config as config_settings
from packrl.cli import build_parser, config_from_args, main, normalize_argv

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = config_settings.settings()


def _toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + "}"
    return repr(value)


def good_values(s):
    """(flag text, file value, the typed value both must give) for one setting."""
    if s.key == "env.id":
        return [("CartPole-v1", "CartPole-v1", "CartPole-v1"), ("minigrid:MiniGrid-Empty-5x5-v0",) * 3]
    if s.key == "train.device":
        return [("cpu", "cpu", "cpu"), ("auto", "auto", "auto")]
    if s.key == "vec.address":
        return [("auto", "auto", "auto"), ("10.0.0.1:6379",) * 3, ("ray://head:10001",) * 3, ("none", None, None)]
    if s.key == "env.kwargs":
        return [("{size = 8, name = 'x'}", {"size": 8, "name": "x"}, {"size": 8, "name": "x"})]
    if s.key == "policy.overrides":
        return [('{"image" = "cnn", "mission/chars" = "embedding"}', {"image": "cnn", "mission/chars": "embedding"},
                 {"image": "cnn", "mission/chars": "embedding"})]
    out = []
    if s.choices:
        out += [(c, c, c) for c in s.choices]
    elif s.base is bool:
        out += [("true", True, True), ("false", False, False)]
    elif s.base is int:
        low = int(s.range.low) if s.range is not None and s.range.low is not None else 0
        out += [(str(low + 3), low + 3, low + 3), ("1_000", 1000, 1000), ("1e3", 1e3, 1000)]  # 1e3 is exactly 1000
    elif s.base is float:
        value = 0.25 if s.range is not None and s.range.high == 1 else 5e-4
        out += [(repr(value), value, value), ("1", 1, 1.0)]
    if s.optional:
        out.append(("none", None, None))
    assert out, f"no good value for {s.key} of type {s.type}: extend the table"
    return out


def bad_values(s):
    """(flag text or None, file value or None) that must be refused."""
    if s.key == "env.id":
        return [("NoSuchEnv-v0", 3)]
    if s.key == "train.device":
        cuda = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
        return [("gpu", "gpu"), (cuda, cuda), (None, 1)]
    if s.key == "vec.address":
        return [("10.0.0.1", "10.0.0.1"), ("host:0", "host:99999"), ("http://h:1", "a b:1"), (None, 6379)]
    if s.key in ("env.kwargs", "policy.overrides"):
        return [("3", 3), ("{a = }", "x")] + ([("{image = 1}", {"image": "vit"})] if s.key == "policy.overrides" else [])
    out = []
    if s.choices:
        out += [("nope", "nope"), (None, 3)]
    elif s.base is bool:
        out += [("maybe", "yes"), (None, 1)]
    elif s.base is int:
        out += [("abc", "abc"), ("4.5", 4.5), (None, True)]
        if s.range is not None and s.range.low is not None:
            out.append((str(int(s.range.low) - 1), int(s.range.low) - 1))
    elif s.base is float:
        out += [("high", "high"), ("nan", float("nan")), ("inf", float("inf")), (None, True)]
        if s.range is not None and s.range.low is not None:
            out.append((str(s.range.low - 1), s.range.low - 1))
        if s.range is not None and s.range.high is not None:
            out.append((str(s.range.high + 1), s.range.high + 1))
    assert out, f"no bad value for {s.key} of type {s.type}: extend the table"
    return out


GOOD = [(s.key, *v) for s in SETTINGS.values() for v in good_values(s)]
BAD_FLAGS = [(s.key, text) for s in SETTINGS.values() for text, _ in bad_values(s) if text is not None]
BAD_FILES = [(s.key, value) for s in SETTINGS.values() for _, value in bad_values(s) if value is not None]


def run(argv, capsys):
    """main() in this process: (exit status, stdout, stderr); argparse's own exits count as statuses."""
    try:
        rc = main(argv)
    except SystemExit as exit_:
        rc = exit_.code
    out, err = capsys.readouterr()
    return rc, out, err


def parsed_config(argv):
    """The config main() would train with, without training."""
    return config_from_args(build_parser().parse_args(normalize_argv(argv)))[0]


def test_the_table_covers_every_setting():
    assert {k for k, *_ in GOOD} == set(SETTINGS) == {k for k, _ in BAD_FILES}
    ppo_fields = {f"train.{name}" for name in __import__("packrl.train.ppo", fromlist=["PPOConfig"]).PPOConfig.__dataclass_fields__}
    assert ppo_fields <= set(SETTINGS)


@pytest.mark.parametrize("key,text,file_value,expected", GOOD, ids=[f"{g[0]}={g[1]}" for g in GOOD])
def test_good_values_land_typed_from_flags_and_files(key, text, file_value, expected, tmp_path):
    section, name = key.split(".")
    for argv in (["train", "--preset", "none", f"--{key}", text], ["train", "--preset", "none", f"--{key}={text}"]):
        value = parsed_config(argv)[section][name]
        assert value == expected and type(value) is type(expected), (argv, value)
    path = tmp_path / "c.toml"
    path.write_text(f"[{section}]\n{name} = {_toml(file_value)}\n" if file_value is not None else f"[{section}]\n")
    value = parsed_config(["train", "--preset", "none", "--config", str(path)])[section].get(name, None)
    if file_value is not None:  # TOML has no null: none is the flag form only
        assert value == expected and type(value) is type(expected), value


@pytest.mark.parametrize("key,text", BAD_FLAGS, ids=[f"{k}={t}" for k, t in BAD_FLAGS])
def test_bad_flag_values_are_one_line_and_exit_2(key, text, capsys, tmp_path):
    rc, out, err = run(["train", f"--{key}", text, "--out", str(tmp_path / "run"), "--no-live"], capsys)
    assert rc == 2, (rc, out, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and (key in err or "unknown env" in err), err
    assert not (tmp_path / "run" / "checkpoint").exists()


@pytest.mark.parametrize("key,value", BAD_FILES, ids=[f"{k}={v!r}" for k, v in BAD_FILES])
def test_bad_file_values_name_the_file_and_key(key, value, capsys, tmp_path):
    section, name = key.split(".")
    path = tmp_path / "bad.toml"
    path.write_text(f"[{section}]\n{name} = {_toml(value)}\n")
    rc, out, err = run(["train", "--config", str(path), "--out", str(tmp_path / "run"), "--no-live"], capsys)
    assert rc == 2, (rc, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert str(path) in err and key in err, err


def test_the_space_and_equals_forms_work_before_and_after_the_env(tmp_path):
    path = tmp_path / "my.toml"
    path.write_text('[env]\nid = "CartPole-v1"\n')
    for argv in (["train", "--config", str(path), "--train.learning_rate", "5e-4"],
                 ["train", "--config", str(path), "--train.learning_rate=5e-4"],
                 ["train", "CartPole-v1", "--train.learning_rate", "5e-4"],
                 ["train", "--train.learning_rate", "5e-4", "CartPole-v1"],
                 ["train", "--train.learning-rate", "5e-4", "CartPole-v1"]):
        config = parsed_config(argv)
        assert config["train"]["learning_rate"] == 5e-4 and config["env"]["id"] == "CartPole-v1", argv


def test_a_negative_number_in_exponent_form_is_a_value_not_a_flag(capsys):
    rc, _, err = run(["train", "CartPole-v1", "--train.ent_coef", "-1e-3"], capsys)
    assert rc == 2 and "--train.ent_coef -1e-3: expected a float >= 0" in err, err


def test_shortcuts_set_their_keys_and_name_themselves_in_errors(capsys):
    config = parsed_config(["train", "CartPole-v1", "--total-steps", "5000", "--seed", "3", "--device", "cpu",
                            "--num-envs", "4", "--backend", "multiprocessing", "--num-workers", "2",
                            "--network", "gru", "--hidden", "32"])
    assert config["train"] | {"total_steps": 5000, "seed": 3, "device": "cpu"} == config["train"]
    assert config["vec"] == {"backend": "multiprocessing", "num_envs": 4, "num_workers": 2, "address": None,
                             "step_timeout": 300.0}
    assert config["policy"]["network"] == "gru" and config["policy"]["hidden"] == 32
    for argv, words in ((["--num-envs", "4.5"], "--num-envs 4.5: expected an int >= 1"),
                        (["--total-steps", "-5"], "--total-steps -5: expected an int >= 1"),
                        (["--network", "rnn"], "--network rnn: expected one of mlp, lstm, gru, mingru")):
        rc, _, err = run(["train", "CartPole-v1", *argv], capsys)
        assert rc == 2 and words in err and err.count("\n") == 1, err


def test_the_issue_cases(capsys, tmp_path):
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[train\ngamma = 0.9\n")
    cases = [
        (["--train.num_steps", "abc"], "--train.num_steps abc: expected an int >= 1"),
        (["--train.gamma", "high"], "--train.gamma high: expected a float in [0, 1]"),
        (["--num-workers", "2"], "vec.num_workers = 2 applies to the multiprocessing and ray backends, not backend 'serial'"),
        (["--device", "cuda" if not torch.cuda.is_available() else "cuda:99"], "--device cuda"),
        (["--config", str(tmp_path / "missing.toml")], f"{tmp_path / 'missing.toml'}: no such config file"),
        (["--config", str(bad_toml)], f"{bad_toml}: not valid TOML: Expected ']'"),
        (["--train.bptt_horizon", "5", "--network", "lstm"], "train.bptt_horizon = 5 must divide train.num_steps = 32"),
        (["--backend", "numba"], "vec.backend = 'numba' steps packrl's Numba envs"),
        (["--train.learning_rat", "1"], "unknown flag --train.learning_rat (did you mean --train.learning_rate"),
    ]
    for argv, words in cases:
        rc, out, err = run(["train", "CartPole-v1", "--out", str(tmp_path / "run"), "--no-live", *argv], capsys)
        assert rc == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_unknown_sections_and_keys_in_files_suggest_the_close_one(capsys, tmp_path):
    path = tmp_path / "c.toml"
    for text, words in (("[trian]\ngamma = 0.9\n", "unknown config section [trian] (did you mean train?)"),
                        ("[train]\nlearnin_rate = 1e-3\n", "unknown key train.learnin_rate (did you mean train.learning_rate?)"),
                        ("gamma = 0.9\n", "unknown config section [gamma]")):
        path.write_text(text)
        rc, _, err = run(["train", "--config", str(path)], capsys)
        assert rc == 2 and str(path) in err and words in err and err.count("\n") == 1, err


def test_help_lists_every_setting_with_its_default(capsys):
    rc, out, _ = run(["train", "--help"], capsys)
    assert rc == 0
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    by_dest = {a.dest: a for a in train._actions}
    for s in SETTINGS.values():
        assert s.flag in out, s.flag
        action = by_dest[f"cfg:{s.key}"]
        assert "default: " in action.help and s.help in action.help, action.help
        assert action.default is None  # only flags given on the command line reach the config
    for name in ("gridworld", "classic-control", "minigrid"):
        assert name in out  # the presets are listed in the epilog


def test_no_traceback_and_version_in_a_real_process(tmp_path):
    def packrl(*argv):
        return subprocess.run([sys.executable, "-m", "packrl", *argv], capture_output=True, text=True, cwd=tmp_path)

    version = packrl("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"packrl {__import__('packrl').__version__}"
    for argv in (["train", "--train.gamma", "high"], ["train", "--num-envs", "4.5"], ["train", "--config", "nope.toml"],
                 ["train", "--train.nope", "1"]):
        proc = packrl(*argv)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- property tests of the flag text

NUM_ENVS = SETTINGS["vec.num_envs"]
GAMMA = SETTINGS["train.gamma"]


@hsettings(max_examples=200, deadline=None)
@given(st.integers(min_value=-10**12, max_value=10**12))
def test_any_int_text_lands_exactly_or_is_refused_by_range(n):
    if n >= 1:
        assert NUM_ENVS.parse(str(n)) == n and type(NUM_ENVS.parse(str(n))) is int
    else:
        with pytest.raises(config_settings.ConfigError, match=f"--vec.num_envs {n}: expected an int >= 1"):
            NUM_ENVS.parse(str(n))


@hsettings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_text_is_taken_exactly_within_range_and_refused_outside(x):
    text = repr(x)
    if 0 <= x <= 1:
        assert GAMMA.parse(text) == x
    else:
        with pytest.raises(config_settings.ConfigError, match="expected a float in \\[0, 1\\]"):
            GAMMA.parse(text)
    if x == x and abs(x) != float("inf") and not float(x).is_integer():
        with pytest.raises(config_settings.ConfigError, match="expected an int"):
            NUM_ENVS.parse(text)  # never truncated


@hsettings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(SETTINGS)), st.text(max_size=20))
def test_any_text_for_any_setting_is_a_value_or_one_config_error(key, text):
    setting = SETTINGS[key]
    try:
        value = setting.parse(text)
    except config_settings.ConfigError as err:
        assert "\n" not in str(err) and setting.key in str(err)
    else:
        assert setting.check(value) == value  # what parse gives passes the typed check as it is
