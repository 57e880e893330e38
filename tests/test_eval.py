"""``packrl eval``: sampled and greedy returns side by side on the eval's own envs, reproducible by seed,
a GIF of an episode, and one-line refusals of bad flags."""
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from packrl import vector
from packrl.cli import main
from packrl.models import Policy
from packrl.train.evaluate import EvaluationError, evaluate
from tests.saved_policies import save_untrained


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained CartPole policy saved by training's own save: its sampled and greedy returns differ."""
    return save_untrained(tmp_path_factory.mktemp("eval") / "checkpoint")


def _rows(out):
    """{mode: (mean, episodes)} from the printed table."""
    rows = {}
    for line in out.splitlines():
        m = re.search(r"(sampled|greedy)( \((?:default|--mode)\))?\s*│\s*(-?[\d.]+)\s*│(?:[^│]*│){3}\s*(\d+) of (\d+)\s*│", line)
        if m:
            rows[m.group(1)] = (float(m.group(3)), int(m.group(5)), bool(m.group(2)))
    return rows


def test_sampled_and_greedy_side_by_side_with_the_default_named(checkpoint, capsys):
    assert main(["eval", str(checkpoint), "--episodes", "6", "--num-envs", "3", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == {"sampled", "greedy"}, out
    assert rows["sampled"][1] == rows["greedy"][1] == 6
    assert rows["sampled"][2] and not rows["greedy"][2]
    assert "(sampled, the default; see --mode)" in out
    assert main(["eval", str(checkpoint), "--episodes", "6", "--num-envs", "3", "--seed", "1", "--mode", "greedy"]) == 0
    out = capsys.readouterr().out
    again = _rows(out)
    assert again["greedy"][2] and not again["sampled"][2]
    # greedy is what --mode asked for, never labelled the default
    assert "greedy (--mode)" in out and "(default)" not in out and "(greedy, as --mode asked)" in out
    assert again["sampled"][0] == rows["sampled"][0] and again["greedy"][0] == rows["greedy"][0]  # same seed, same run


def _time_limits(out):
    """{mode: episodes truncated by the time limit} from the printed table's last column."""
    found = re.findall(r"(sampled|greedy)[^│]*│(?:[^│]*│){4}\s*(\d+) of \d+\s*│", out)
    return {mode: int(n) for mode, n in found}


def test_greedy_loops_are_counted_and_said(tmp_path, capsys):
    """An untrained MiniGrid policy: its argmax repeats one action (it turns in place) until the 100-step time
    limit in every episode, while sampling reaches the goal in some. The table's time-limit column counts them,
    and a note says why greedy loops."""
    path = save_untrained(tmp_path / "checkpoint", env_id="MiniGrid-Empty-5x5-v0")
    assert main(["eval", str(path), "--episodes", "8", "--num-envs", "4", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    limits = _time_limits(out)
    assert limits["greedy"] == 8 and limits["sampled"] < 8, out
    assert f"note: {8 - limits['sampled']} more greedy than sampled episodes ran to the time limit" in out
    assert _rows(out)["greedy"][0] == 0.0


def test_the_seed_changes_the_sampled_episodes(checkpoint, capsys):
    means = set()
    for seed in ("1", "2", "3"):
        assert main(["eval", str(checkpoint), "--episodes", "4", "--seed", seed]) == 0
        means.add(_rows(capsys.readouterr().out)["sampled"][0])
    assert len(means) > 1


class Fixed(gym.Env):
    """``reward`` per step; env i's episodes last 3 + 4 * i steps (the i-th env made)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length, reward=1.0):
        self.length, self.reward, self.t = length, reward, 0

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), self.reward, self.t >= self.length, False, {}


def _fixed_envs(n, reward=1.0):
    from packrl.emulation import emulate

    made = []

    def creator():  # finite_rewards=False: the env's NaN reaches the evaluation, as it may from a Numba env
        made.append(1)
        return emulate(Fixed(3 + 4 * (len(made) - 1), reward), finite_rewards=False)
    return vector.make(creator, n, seed=0)


def test_each_env_plays_its_quota_so_short_episodes_are_not_over_counted():
    env = _fixed_envs(2)
    policy = Policy.from_env(env, hidden=8)
    try:
        returns = evaluate(policy, env, deterministic=False, episodes=5)
    finally:
        env.close()
    assert sorted(returns.tolist()) == [3.0, 3.0, 3.0, 7.0, 7.0]  # 3 episodes of env 0, 2 of env 1
    assert torch.get_rng_state().shape[0] > 0  # the global RNG is still usable (the eval forked it)


def test_a_non_finite_reward_is_an_error_not_a_return(capsys):
    env = _fixed_envs(2, reward=float("nan"))
    policy = Policy.from_env(env, hidden=8)
    try:
        with pytest.raises(EvaluationError, match=r"env row 0 returned reward nan at step 0"):
            evaluate(policy, env, episodes=2)
    finally:
        env.close()


def test_render_writes_a_gif_of_one_episode(checkpoint, tmp_path, capsys):
    out = tmp_path / "episode.gif"
    assert main(["eval", str(checkpoint), "--episodes", "2", "--render", str(out)]) == 0
    import imageio.v3 as iio

    frames = iio.imread(out, index=None)
    assert frames.ndim == 4 and frames.shape[0] >= 8 and frames.shape[-1] in (3, 4)  # CartPole falls in >= 8 steps
    assert frames[0].std() > 0  # a picture, not a blank frame
    assert "video:" in capsys.readouterr().out


def test_render_never_writes_through_a_symlink(checkpoint, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    (tmp_path / "episode.gif").symlink_to(victim)
    assert main(["eval", str(checkpoint), "--episodes", "2", "--render", str(tmp_path / "episode.gif")]) == 2
    assert "symlink" in capsys.readouterr().err and victim.read_text() == "the user's file\n"


def test_render_of_an_env_without_frames_is_one_line(tmp_path, capsys):
    path = save_untrained(tmp_path / "grid", "gridworld", hidden=8)
    assert main(["eval", str(path), "--episodes", "2", "--render", str(tmp_path / "x.gif")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gridworld" in err and not (tmp_path / "x.gif").exists()


@pytest.mark.parametrize("flags,needle", [
    (["--episodes", "0"], "--episodes"),
    (["--episodes", "x"], "--episodes"),
    (["--num-envs", "-1"], "--num-envs"),
    (["--seed", "-5"], "--seed"),
    (["--mode", "best"], "--mode"),
    (["--env-kwargs", "[1]"], "--env-kwargs"),
    (["--render", "out.avi"], "--render"),
    (["--frobnicate"], "frobnicate"),
])
def test_bad_flags_are_one_line_and_exit_2(checkpoint, capsys, flags, needle):
    with pytest.raises(SystemExit) as info:
        main(["eval", str(checkpoint), *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_a_device_that_is_not_there_is_one_line(checkpoint, capsys):
    assert main(["eval", str(checkpoint), "--device", "tpu9"]) == 2
    assert "--device 'tpu9'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["eval", str(checkpoint), "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_a_missing_checkpoint_and_an_unknown_env_are_one_line(checkpoint, tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == f"packrl eval: checkpoint {tmp_path / 'nothing'}: no such folder\n"
    assert main(["eval", str(checkpoint), "--env", "NoSuchEnv-v0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NoSuchEnv-v0" in err


def nan_cartpole():
    return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: float("nan"))


def test_an_env_with_a_nan_reward_exits_1_with_one_line(checkpoint, capsys):
    """The emulator refuses the NaN reward: one line naming it, exit 1, and no return printed."""
    rc = main(["eval", str(checkpoint), "--episodes", "2", "--env", "tests.test_eval:nan_cartpole"])
    captured = capsys.readouterr()
    assert rc == 1 and "mean return" not in captured.out
    assert captured.err.count("\n") == 1 and "reward=nan" in captured.err and "not finite" in captured.err


def test_a_mujoco_policy_renders_without_a_display(tmp_path):
    """`packrl eval --render` of a MuJoCo checkpoint on a machine without a display: MuJoCo's default OpenGL
    (GLFW) has no context there, so packrl renders through EGL unless MUJOCO_GL says otherwise; the GIF holds
    the episode's frames."""
    import os
    import subprocess
    import sys

    import imageio.v3 as iio

    path = save_untrained(tmp_path / "checkpoint", env_id="InvertedPendulum-v5")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM")}
    gif = tmp_path / "episode.gif"
    done = subprocess.run([sys.executable, "-m", "packrl", "eval", str(path), "--episodes", "2", "--render", str(gif)],
                          env=env, capture_output=True, text=True, timeout=600)  # quiet: the whole test takes 2 s
    assert done.returncode == 0, done.stdout + done.stderr
    frames = iio.imread(gif)
    assert frames.ndim == 4 and frames.shape[0] > 1 and frames.shape[-1] == 3 and frames.std() > 0
