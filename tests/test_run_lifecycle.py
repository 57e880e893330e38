"""A training run from start to end: run folders, same seed same checkpoint, periodic checkpoints, SIGTERM
and SIGINT, resuming (compared with an uncut run), the NaN guard, agent steps in AEC games, and the win
rate of two-player games against a random opponent."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packrl.checkpoint import load_checkpoint, read_metadata, sha256_file
from packrl.cli import main
from packrl.train.session import read_history

ROOT = Path(__file__).resolve().parents[1]
LENGTH = 8  # countdown episodes: as long as a rollout, so every iteration boundary is an episode boundary


class Countdown(gym.Env):
    """Episodes of exactly LENGTH steps whatever the seed: reward 1 when the action equals the step's
    parity (shown in the observation). ``sigterm_at``: at its own step ``sigterm_at`` the env sends its
    process SIGTERM; ``blow_up_after``: after that many of its own steps its reward is 3e38."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, sigterm_at: int | None = None, reward_scale: float = 1.0, blow_up_after: int | None = None,
                 symlink: list | None = None):
        self.sigterm_at, self.reward_scale, self.blow_up_after = sigterm_at, reward_scale, blow_up_after
        self.symlink = symlink  # [at_step, link, target]: make that symlink at that step of its own
        self.t = self.taken = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.t / LENGTH, self.t % 2], np.float32)

    def step(self, action):
        reward = float(int(action) == self.t % 2) * self.reward_scale
        self.taken += 1
        if self.blow_up_after is not None and self.taken > self.blow_up_after:
            reward = 3e38  # finite in float32, but returns and losses built from it are not
        if self.symlink is not None and self.taken == self.symlink[0] and not os.path.lexists(self.symlink[1]):
            os.symlink(self.symlink[2], self.symlink[1])
        if self.sigterm_at is not None and self.taken == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        self.t += 1
        return self._obs(), reward, self.t >= LENGTH, False, {}


def countdown_env(**kwargs):
    return Countdown(**kwargs)


class NaNPosition(gym.Env):
    """A Dict observation whose float leaf 'pos' holds NaN from the 3rd step on, in the env seeded 1 only."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                                         "room": gym.spaces.Discrete(3)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.which = seed
        self.t = 0
        return {"pos": np.zeros(2, np.float32), "room": 0}, {}

    def step(self, action):
        self.t += 1
        bad = self.which == 1 and self.t >= 3
        return {"pos": np.array([0.0, np.nan if bad else 1.0], np.float32), "room": 1}, 0.0, False, self.t >= 20, {}


def nan_position_env():
    return NaNPosition()


def _train(*args: str) -> int:
    return main(["train", *args, "--no-live", "--checkpoint-minutes", "0"])


def _countdown(out: Path, *extra: str) -> int:
    return _train("tests.test_run_lifecycle:countdown_env", "--num-envs", "4", "--train.num_steps", str(LENGTH),
                  "--hidden", "16", "--total-steps", str(LENGTH * 4 * 12), "--seed", "3", "--out", str(out), *extra)


def _weights(checkpoint: Path) -> str:
    return sha256_file(checkpoint / "model.safetensors")


def _timeless(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if not k.endswith(("seconds", "sps"))} for h in history]


# ---------------------------------------------------------------- seeds and folders


def test_same_seed_gives_the_same_checkpoint_and_another_seed_does_not(tmp_path):
    args = ["gridworld", "--num-envs", "4", "--total-steps", "512", "--train.num_steps", "64", "--hidden", "16"]
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        assert _train(*args, "--seed", seed, "--out", str(tmp_path / name)) == 0
    a, b, c = (_weights(tmp_path / n / "checkpoint") for n in "abc")
    assert a == b  # weights, optimizer state and all: the same bytes
    assert a != c


def test_each_run_gets_its_own_folder_and_none_is_overwritten_unless_asked(tmp_path, capsys):
    args = ["gridworld", "--num-envs", "2", "--total-steps", "64", "--train.num_steps", "32", "--hidden", "8",
            "--runs-dir", str(tmp_path / "runs")]
    assert _train(*args) == 0 and _train(*args) == 0
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(f.name.startswith("gridworld-") for f in folders)
    assert _train(*args, "--name", "mine") == 0
    first = _weights(tmp_path / "runs" / "mine" / "checkpoint")
    capsys.readouterr()
    assert _train(*args, "--name", "mine") == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert _weights(tmp_path / "runs" / "mine" / "checkpoint") == first
    assert _train(*args, "--name", "mine", "--overwrite", "--seed", "9") == 0
    assert _weights(tmp_path / "runs" / "mine" / "checkpoint") != first
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine")
    assert _train(*args, "--out", str(stranger), "--overwrite") == 2
    assert (stranger / "keep.txt").read_text() == "mine"
    assert "not a packrl run folder" in capsys.readouterr().err


def test_periodic_checkpoints_keep_the_newest_k(tmp_path):
    out = tmp_path / "run"
    assert _countdown(out, "--checkpoint-every", str(LENGTH * 4 * 2), "--keep", "2") == 0
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    # saves at steps 64, 128, ..., 320 (the final step 384 goes to checkpoint/ only): the newest two stay
    assert kept == ["step-000000000256", "step-000000000320"]
    assert read_metadata(out / "checkpoints" / kept[-1])["global_step"] == 320
    assert read_metadata(out / "checkpoint")["global_step"] == LENGTH * 4 * 12
    history = read_history(out / "history.jsonl")
    assert [h["iteration"] for h in history] == list(range(1, 13))


def test_a_failed_periodic_save_removes_no_older_checkpoint(tmp_path, capsys):
    """The checkpoint due at step 128 cannot be written (the env made its folder a symlink during iteration
    3, and checkpoints refuse symlinks): the run stops with exit 3 and the checkpoint of step 64 is still
    there and loads, though --keep is 1."""
    out = tmp_path / "run"
    (tmp_path / "elsewhere").mkdir()
    trap = [LENGTH * 2 + 1, str(out / "checkpoints" / "step-000000000128"), str(tmp_path / "elsewhere")]
    assert _countdown(out, "--checkpoint-every", str(LENGTH * 4 * 2), "--keep", "1",
                      "--env.kwargs", "{symlink = [%d, '%s', '%s']}" % tuple(trap)) == 3
    assert "symlink" in capsys.readouterr().err  # a stop is said on stderr
    assert load_checkpoint(out / "checkpoints" / "step-000000000064")[1]["global_step"] == 64
    assert read_metadata(out / "checkpoint")["global_step"] == 64
    assert not any((tmp_path / "elsewhere").iterdir())


# ---------------------------------------------------------------- resume


def test_a_run_cut_by_sigterm_and_resumed_ends_exactly_as_the_uncut_run(tmp_path, capsys):
    uncut, cut = tmp_path / "uncut", tmp_path / "cut"
    assert _countdown(uncut) == 0
    # the envs send SIGTERM during iteration 6 (their own step 43, of 8 per iteration): the run finishes
    # that iteration, saves and exits 143
    assert _countdown(cut, "--env.kwargs", "{sigterm_at = 43}") == 143
    assert "SIGTERM" in capsys.readouterr().err
    assert read_metadata(cut / "checkpoint")["iteration"] == 6
    # a checkpoint is data: without the env on the command line its module:function id is refused
    assert main(["train", "--resume", str(cut), "--no-live"]) == 2
    assert "names code" in capsys.readouterr().err
    assert main(["train", "--resume", str(cut), "--no-live", "--hidden", "32"]) == 2
    assert "policy.hidden" in capsys.readouterr().err
    assert main(["train", "tests.test_run_lifecycle:countdown_env", "--resume", str(cut), "--no-live"]) == 0
    assert _weights(cut / "checkpoint") == _weights(uncut / "checkpoint")
    resumed, original = read_history(cut / "history.jsonl"), read_history(uncut / "history.jsonl")
    assert _timeless(resumed) == _timeless(original)  # steps, learning rates, losses, returns: the same curve


def test_resume_restores_counters_optimizer_and_rng_states_of_a_numba_run(tmp_path):
    out = tmp_path / "run"
    args = ["gridworld", "--num-envs", "4", "--train.num_steps", "32", "--hidden", "16", "--seed", "2"]
    assert _train(*args, "--total-steps", "384", "--out", str(out), "--checkpoint-every", "128", "--keep", "5") == 0
    mid = out / "checkpoints" / "step-000000000256"
    state, meta, optimizer = load_checkpoint(mid)
    assert meta["resume"]["global_step"] == 256 and meta["resume"]["iteration"] == 2
    assert optimizer is not None and optimizer["state"]
    from packrl.train.ppo import PPO, PPOConfig
    from packrl.train.run import make_policy, make_vecenv

    vecenv = make_vecenv(meta["config"], seed=2)
    try:
        ppo = PPO(vecenv, make_policy(vecenv, meta["config"]["policy"]), PPOConfig(**{
            k: v for k, v in meta["config"]["train"].items() if k != "total_steps"}))
        ppo.load_training_state(meta["resume"], state, optimizer)
        assert (ppo.global_step, ppo.iteration) == (256, 2)
        again = ppo.training_state()
        assert again["rng"] == meta["resume"]["rng"]
        loaded = ppo.optimizer.state_dict()
        for param, entries in optimizer["state"].items():
            for key, value in entries.items():
                assert torch.equal(torch.as_tensor(loaded["state"][param][key]), torch.as_tensor(value))
        history = ppo.train(384)
        assert [h["global_step"] for h in history] == [384]
        assert history[0]["learning_rate"] == pytest.approx(2e-3 * (1 - 256 / 384))
    finally:
        vecenv.close()
    # a finished run extended from the command line: its env id is a name, so it is resolved as data
    assert main(["train", "--resume", str(out), "--total-steps", "512", "--no-live", "--checkpoint-minutes", "0"]) == 0
    assert read_metadata(out / "checkpoint")["global_step"] == 512
    assert [h["iteration"] for h in read_history(out / "history.jsonl")] == [1, 2, 3, 4]


# ---------------------------------------------------------------- signals from outside


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_sigint_save_and_exit_with_their_codes(tmp_path, signum, code):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "packrl.cli", "train", "CartPole-v1", "--num-envs", "2", "--total-steps", "100000000",
           "--no-live", "--log-seconds", "0.2", "--out", str(out), "--train.num_steps", "16"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    for line in proc.stdout:  # progress lines: training is under way
        if "steps/s" in line:
            break
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)  # quiet: the whole test takes 2 s
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr, stderr
    state, meta, optimizer = load_checkpoint(out / "checkpoint")
    history = read_history(out / "history.jsonl")
    assert meta["global_step"] == history[-1]["global_step"] > 0 and optimizer is not None
    assert meta["resume"]["iteration"] == history[-1]["iteration"]
    assert f"packrl train --resume {out}" in stderr and "packrl train --resume" not in stdout  # stops on stderr


# ---------------------------------------------------------------- NaN guard


def test_a_nan_observation_stops_training_naming_the_env_row_and_leaf(tmp_path, capsys):
    out = tmp_path / "run"
    rc = _train("tests.test_run_lifecycle:nan_position_env", "--num-envs", "3", "--train.num_steps", "16",
                "--total-steps", "4800", "--hidden", "8", "--out", str(out))
    assert rc == 3
    said = capsys.readouterr().err  # errors and stops on stderr
    assert "iteration 1, rollout step 3: env row 1 (env 1)" in said and "observation leaf ['pos']: nan" in said and "nan" in said
    assert "no checkpoint had been saved yet" in said
    assert not (out / "checkpoint").exists()
    history = read_history(out / "history.jsonl")
    assert "env row 1" in history[-1]["error"]


def test_a_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    rc = _countdown(out, "--env.kwargs", "{blow_up_after = 25}", "--checkpoint-every", str(LENGTH * 4))
    assert rc == 3
    said = capsys.readouterr().err
    # each env's steps 1-24 are iterations 1-3; a 3e38 reward comes at its step 26, in iteration 4
    assert "iteration 4, epoch 1, minibatch 1" in said and "(the first non-finite quantity of the update)" in said
    state, meta, _ = load_checkpoint(out / "checkpoint")
    assert meta["iteration"] == 3 and all(torch.isfinite(t).all() for t in state.values())
    last = json.loads((out / "history.jsonl").read_text().splitlines()[-1])
    assert last["iteration"] == 4 and "iteration 4" in last["error"]
    assert any(last[k] in ("nan", "inf", "-inf") for k in ("pg_loss", "v_loss", "grad_norm"))  # kept, as strings


def test_history_keeps_non_finite_values_as_strings():
    from packrl.train.session import history_line

    line = json.loads(history_line({"a": float("nan"), "b": float("inf"), "c": -float("inf"), "d": 1.5}))
    assert line == {"a": "nan", "b": "inf", "c": "-inf", "d": 1.5}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["pg_loss", "v_loss", "episode_return", "learning_rate"]),
                                st.floats(width=64) | st.integers(-2**53, 2**53), max_size=4),
                max_size=5))
def test_history_reads_back_every_value_it_wrote(rows):
    """Whatever an iteration measured (NaN, infinities, -0.0, huge ints) is read back as it was written."""
    import tempfile

    from packrl.train.session import History

    with tempfile.TemporaryDirectory() as folder:
        history = History(Path(folder) / "history.jsonl")
        for i, row in enumerate(rows, start=1):
            history.append({"iteration": i, **row})
        history.close()
        back = read_history(Path(folder) / "history.jsonl")
    assert len(back) == len(rows)
    for row, got in zip(rows, back):
        for key, value in row.items():
            same = (np.isnan(value) and np.isnan(got[key])) if isinstance(value, float) and np.isnan(value) else \
                got[key] == value and str(got[key]) == str(value)
            assert same, (key, value, got[key])


def test_resume_falls_back_to_the_newest_periodic_checkpoint_when_the_latest_is_damaged(tmp_path):
    from packrl.train.session import RunError, find_checkpoint

    out = tmp_path / "run"
    assert _countdown(out, "--checkpoint-every", str(LENGTH * 4 * 2), "--keep", "2") == 0
    assert find_checkpoint(out) == (out / "checkpoint", out)
    (out / "checkpoint" / "metadata.json").write_text("{ not json")
    assert find_checkpoint(out) == (out / "checkpoints" / "step-000000000320", out)
    assert find_checkpoint(out / "checkpoints" / "step-000000000256") == (out / "checkpoints" / "step-000000000256", out)
    with pytest.raises(RunError, match="no such run"):
        find_checkpoint(tmp_path / "nothing")


# ---------------------------------------------------------------- multi-agent


def test_aec_total_steps_count_acting_agents_and_games_report_rates_against_random(tmp_path, capsys):
    out = tmp_path / "run"
    rc = _train("pettingzoo.classic.tictactoe_v3", "--num-envs", "4", "--train.num_steps", "64", "--hidden", "16",
                "--total-steps", "512", "--versus-every", "1", "--versus-games", "4", "--out", str(out))
    assert rc == 0
    history = read_history(out / "history.jsonl")
    # 4 envs x 64 steps, one acting agent per env and step: 256 agent steps per iteration, 2 iterations
    assert [h["global_step"] for h in history] == [256, 512]
    assert read_metadata(out / "checkpoint")["global_step"] == 512
    for h in history:
        rates = [h[f"vs_random/{k}"] for k in ("win", "draw", "loss")]
        assert sum(rates) == pytest.approx(1.0) and all(r in (0, 0.25, 0.5, 0.75, 1) for r in rates)
    assert any("episode_return/player_1" in h for h in history)
    capsys.readouterr()
    assert main(["eval", str(out / "checkpoint"), "--episodes", "4"]) == 0
    said = capsys.readouterr().out
    assert "against a uniformly random legal opponent (4 games" in said and ("win 0." in said or "win 1.00" in said)


def test_versus_random_counts_wins_for_the_policy_seat():
    """A policy that always drops in the centre column beats a random connect-four opponent most of the
    time; the same check is reproducible and leaves the global torch RNG as it found it."""
    from packrl.train.run import env_creator, make_policy, make_vecenv
    from packrl.train.versus import is_two_player_zero_sum, versus_random

    env_id = "pettingzoo.classic.connect_four_v3"
    assert is_two_player_zero_sum(env_id) and is_two_player_zero_sum("pettingzoo.classic.tictactoe_v3")
    assert not is_two_player_zero_sum("pettingzoo.classic.hanabi_v5") and not is_two_player_zero_sum("CartPole-v1")
    config = {"env": {"id": env_id, "kwargs": {}, "api": "auto"}, "vec": {"backend": "serial", "num_envs": 1},
              "policy": {"encoder": "layout", "network": "mlp", "hidden": 16, "decoder": "default", "overrides": {}}}
    vecenv = make_vecenv(config)
    policy = make_policy(vecenv, config["policy"])
    vecenv.close()
    creator = env_creator(env_id)[0]
    before = torch.get_rng_state()
    plain = versus_random(policy, creator, games=10, seed=4)
    assert torch.equal(torch.get_rng_state(), before)
    assert versus_random(policy, creator, games=10, seed=4) == plain
    last = [m for m in policy.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 7][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 50.0, 0.0, 0.0, 0.0]))
    centre = versus_random(policy, creator, games=20, seed=4, greedy=True)
    assert centre["win"] >= 0.8 and centre["win"] + centre["draw"] + centre["loss"] == pytest.approx(1.0)
