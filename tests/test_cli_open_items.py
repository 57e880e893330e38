"""The command line's open items of issue 29: --hidden capped at the loader's limit, a bad env.kwargs in one
line, what --resume prints and advises, unknown-flag suggestions per subcommand, eval --render that fails
before evaluating, and no preset line before an error found later."""
import gymnasium as gym
import numpy as np
import pytest

from packrl.cli import main
from tests.saved_policies import save_untrained


def _lines(text):
    return [line for line in text.strip().splitlines() if line.strip()]


def test_hidden_is_capped_at_what_the_loader_accepts(tmp_path, capsys):
    from packrl.train.checkpoint_env import MAX_HIDDEN

    assert main(["train", "CartPole-v1", "--hidden", str(MAX_HIDDEN + 1), "--out", str(tmp_path / "r")]) == 2
    out = capsys.readouterr()
    assert _lines(out.err) == [f"packrl train: --hidden {MAX_HIDDEN + 1}: expected an int in [1, {MAX_HIDDEN}] "
                               "(policy.hidden)"]
    assert "preset" not in out.out and not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["train", "check"])
def test_a_bad_env_kwargs_is_one_line(tmp_path, capsys, command):
    args = ["--out", str(tmp_path / "r"), "--no-live"] if command == "train" else []
    assert main([command, "CartPole-v1", "--env.kwargs", "{nope = 1}", *args]) == 2
    out = capsys.readouterr()
    (line,) = _lines(out.err)
    assert "could not be made with env.kwargs {'nope': 1}" in line and "unexpected keyword argument 'nope'" in line
    assert "preset" not in out.out and not (tmp_path / "r").exists()


class Steps(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 8, False, {}


def steps_env():
    return Steps()


def test_resume_prints_what_it_resumes_and_how_to_resume_a_code_env(tmp_path, capsys):
    out = tmp_path / "run"
    env_id = "tests.test_cli_open_items:steps_env"
    assert main(["train", env_id, "--num-envs", "1", "--total-steps", "32", "--train.num_steps", "16", "--no-live",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--no-live", "--total-steps", "48"]) == 2
    (line,) = _lines(capsys.readouterr().err)
    assert f"give the env on the command line: packrl train {env_id} --resume {out}" in line
    assert main(["train", env_id, "--resume", str(out), "--no-live", "--total-steps", "48"]) == 0
    text = capsys.readouterr().out
    assert "preset:" not in text  # the command line's preset is not what a resumed run uses
    assert f"resuming {out} from {out / 'checkpoint'} (step 32" in text


@pytest.mark.parametrize("argv, suggestion", [
    (["train", "CartPole-v1", "--lr", "1e-3"], "(did you mean --train.learning_rate?)"),
    (["train", "CartPole-v1", "--gamma", "0.9"], "(did you mean --train.gamma?)"),
    (["eval", "x", "--total-steps", "5"], None),  # a train flag is no suggestion for eval
    (["eval", "x", "--episode", "5"], "(did you mean --episodes"),
    (["train", "CartPole-v1", "--episodes", "5"], None),  # an eval flag is no suggestion for train
])
def test_unknown_flags_are_matched_within_their_subcommand(capsys, argv, suggestion):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    (line,) = _lines(capsys.readouterr().err)
    assert line.startswith(f"packrl {argv[0]}: error: unknown flag {argv[2]}")
    if suggestion is None:
        assert "did you mean" not in line
    else:
        assert suggestion in line


class NoRender(Steps):
    metadata = {"render_modes": []}


def test_eval_render_of_an_env_that_cannot_render_fails_before_evaluating(tmp_path, capsys):
    gym.register("PackrlNoRender-v0", entry_point=NoRender)
    try:
        path = save_untrained(tmp_path / "c", "PackrlNoRender-v0", hidden=8)
        assert main(["eval", str(path), "--episodes", "2", "--render", str(tmp_path / "x.gif")]) == 2
        out = capsys.readouterr()
    finally:
        del gym.registry["PackrlNoRender-v0"]
    (line,) = _lines(out.err)
    assert "--render: 'PackrlNoRender-v0' cannot render rgb_array frames" in line
    assert "mean return" not in out.out and not (tmp_path / "x.gif").exists()


def test_no_preset_line_before_an_error_found_later(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["train", "CartPole-v1", "--out", str(tmp_path / "taken"), "--no-live"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "already exists" in _lines(out.err)[0]


class ThreadsSeen(Steps):
    """Appends torch's intra-op thread count at each step to the file ``record``."""

    def __init__(self, record: str):
        self.record = record

    def step(self, action):
        import torch

        with open(self.record, "a") as f:
            f.write(f"{torch.get_num_threads()}\n")
        return super().step(action)


def threads_env(record):
    return ThreadsSeen(record)


def test_train_command_trains_on_the_cli_threads_and_gives_them_back(tmp_path, monkeypatch):
    import torch

    from packrl.commands.train import train_command
    from packrl.train.run import merge_config

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    record = tmp_path / "threads.txt"
    try:
        config = merge_config({"env": {"id": "tests.test_cli_open_items:threads_env", "kwargs": {"record": str(record)}},
                               "vec": {"num_envs": 1}, "train": {"total_steps": 16, "num_steps": 16}})
        assert train_command(config, out=tmp_path / "r", live=False) == 0
        assert set(record.read_text().split()) == {"1"}  # as `packrl train` trains
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_the_top_level_command_line_imports_neither_torch_nor_numba(argv):
    """`packrl --help` and `packrl --version` took 2.4-3.2 s building every subcommand's parser; now 0.16 s
    quiet on the project machine (checked by what is imported, not by the clock)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\nfrom packrl.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    code = e.code\nprint(sorted(m for m in ('torch', 'numba', 'numpy') if m in sys.modules), code)")
    root = Path(__file__).resolve().parents[1]
    # quiet: the whole test takes under 1 s
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300, cwd=root)
    assert done.stdout.strip().splitlines()[-1] == f"[] {2 if not argv else 0}", done.stdout + done.stderr


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback():
    """`packrl configs | head -1`: silence and 141 (128 + SIGPIPE) once the reader is gone, not a BrokenPipeError.
    The reader leaves before the command writes (its start-up imports take far longer than closing a pipe)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "packrl.cli", "configs"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err  # quiet: the whole test takes under 1 s
    assert "Traceback" not in err and "BrokenPipe" not in err, err
