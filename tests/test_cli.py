"""The packrl command: train/eval/check end to end, config layering, env ids, Ctrl-C, TensorBoard."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from packrl.checkpoint import load_checkpoint, read_metadata
from packrl.cli import main
from packrl.train.run import ConfigError, env_creator, load_config_file, merge_config

ROOT = Path(__file__).resolve().parents[1]


class NaNReward(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), float("nan"), False, False, {}


def nan_reward_env():
    return NaNReward()


def test_train_then_eval_a_numba_env(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "gridworld", "--num-envs", "8", "--total-steps", "2048", "--no-live", "--out", str(out),
               "--train.num_steps", "64", "--policy.hidden", "32"])
    assert rc == 0
    meta = read_metadata(out / "checkpoint")
    assert meta["env_id"] == "gridworld" and meta["global_step"] == 2048
    assert meta["config"]["policy"]["hidden"] == 32 and meta["config"]["train"]["num_steps"] == 64
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert len(history) == 4 and history[-1]["global_step"] == 2048
    assert main(["eval", str(out / "checkpoint"), "--episodes", "4"]) == 0
    assert "mean return" in capsys.readouterr().out
    # the run folder (what train prints first) stands for its newest checkpoint
    assert main(["eval", str(out), "--episodes", "4"]) == 0
    printed = capsys.readouterr().out
    assert f"checkpoint: {out / 'checkpoint'}" in printed.replace("\n", "") and "mean return" in printed
    (out / "checkpoint" / "metadata.json").unlink()  # no loadable checkpoint left: one line naming the folder, exit 2
    assert main(["eval", str(out), "--episodes", "4"]) == 2
    assert f"packrl eval: checkpoint {out}: no loadable checkpoint in it" in capsys.readouterr().err


def test_config_file_then_flags(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[env]\nid = "CartPole-v1"\n[vec]\nnum_envs = 3\n[train]\nlearning_rate = 0.01\nnum_steps = 16\n')
    ini = tmp_path / "c.ini"
    ini.write_text("[policy]\nnetwork = \"lstm\"\nhidden = 24\n")
    config = merge_config(load_config_file(toml), load_config_file(ini), {"train": {"learning_rate": 0.5}})
    assert config["vec"]["num_envs"] == 3 and config["policy"]["network"] == "lstm" and config["policy"]["hidden"] == 24
    assert config["train"]["learning_rate"] == 0.5 and config["train"]["num_steps"] == 16
    with pytest.raises(ConfigError, match="train.learning_rat"):
        merge_config({"train": {"learning_rat": 1}})
    with pytest.raises(ConfigError, match="section"):
        merge_config({"optim": {}})


def test_env_ids_resolve_to_their_kind():
    from pettingzoo.utils.env import AECEnv

    assert env_creator("gridworld")[1] == "numba"
    creator, backend = env_creator("CartPole-v1")
    assert backend == "serial" and creator().spec.id == "CartPole-v1"
    assert isinstance(env_creator("pettingzoo.classic.connect_four_v3")[0](), AECEnv)
    assert type(env_creator("tests.test_cli:nan_reward_env")[0]()).__name__ == "NaNReward"
    with pytest.raises(ConfigError, match="unknown env"):
        env_creator("NoSuchEnv-v0")


def test_check_reports_non_finite_rewards(capsys):
    assert main(["check", "CartPole-v1", "--num-envs", "2", "--steps", "8"]) == 0
    assert main(["check", "tests.test_cli:nan_reward_env", "--num-envs", "2", "--steps", "4"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_tensorboard_logs_when_asked(tmp_path):
    args = ["train", "CartPole-v1", "--num-envs", "2", "--total-steps", "64", "--no-live", "--out", str(tmp_path / "r"),
            "--train.num_steps", "32", "--tensorboard", str(tmp_path / "tb")]
    assert main(args) == 0
    # TensorBoard writes into a fresh subfolder named after the run, nowhere else
    assert [p.name for p in (tmp_path / "tb").iterdir()] == ["r"]
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb" / "r").iterdir())


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "packrl.cli", "train", "CartPole-v1", "--num-envs", "2", "--total-steps", "100000000",
           "--no-live", "--log-seconds", "0.5", "--out", str(out), "--train.num_steps", "16"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    seen = ""
    while "steps/s" not in seen:  # a progress line: training is under way
        line = proc.stdout.readline()
        assert line, seen + proc.stderr.read()
        seen += line
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)  # quiet: the whole test takes 3 s
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert "interrupted by SIGINT (Ctrl-C) at" in stderr and "interrupted" not in stdout  # a stop goes to stderr
    state, meta, optimizer = load_checkpoint(out / "checkpoint")
    assert meta["global_step"] > 0 and optimizer is not None
