"""Issue 42's command-line items, driven as a user types them (a subprocess per command): errors and stops on
stderr and results on stdout, bad input refused before torch or numba is imported, a mistyped command, help
texts, one env-kwargs syntax, eval's progress, captions and time-limit note, a zero-sum game's closing score,
and the small things (a percentage past 100, pluralization, the env picked when none is named)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from tests.saved_policies import save_untrained
from tests.test_terminal import run_on_pty

ROOT = Path(__file__).resolve().parents[1]
HERE = "tests.test_cli_first_hour"
MODULES_AT_EXIT = ("import atexit, sys\n"
                   "atexit.register(lambda: print('modules:', *sorted(m for m in ('torch', 'numba') if m in sys.modules),"
                   " file=sys.stderr))\n"
                   "from packrl.cli import main\n"
                   "sys.exit(main(sys.argv[1:]))\n")
"""``python -c`` text that runs the packrl command and, at exit, names which of torch and numba it imported."""


def packrl(*args: str, cwd: Path = ROOT, timeout: float = 300, modules: bool = False) -> subprocess.CompletedProcess:
    """``packrl ARGS`` in a fresh process, as a shell runs it (stdout and stderr apart; not a terminal)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    head = [sys.executable, "-c", MODULES_AT_EXIT] if modules else [sys.executable, "-m", "packrl"]
    return subprocess.run([*head, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------- envs the tests train and evaluate on


class Raises(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t > 20:
            raise RuntimeError("boom in step")
        return np.zeros(3, np.float32), 1.0, False, False, {}


def raises_env():
    return Raises()


class NaNReward(Raises):
    def step(self, action):
        return np.zeros(3, np.float32), float("nan"), False, False, {}


def nan_reward_env():
    return NaNReward()


class Repeat(Raises):
    """Constant observations, so a greedy policy repeats one action. ``reward_for_staying``: +1 per step until the
    action changes, which ends the episode (the time limit at 10 steps is the best outcome, as in CartPole);
    else 0 per step and +1 for changing the action (the time limit is a greedy policy stuck in a loop)."""

    reward_for_staying = True

    def step(self, action):
        self.t += 1
        first = self.first = int(action) if self.t == 1 else self.first
        changed = int(action) != first
        reward = float(not changed) if self.reward_for_staying else float(changed)
        return np.zeros(3, np.float32), reward, changed, self.t >= 10 and not changed, {}


class Loop(Repeat):
    reward_for_staying = False


def repeat_env():
    return Repeat()


def loop_env():
    return Loop()


# ---------------------------------------------------------------- errors and stops on stderr


@pytest.mark.parametrize(("env", "why"), [("raises_env", "env 0 raised: RuntimeError: boom in step"),
                                          ("nan_reward_env", "reward=nan")])
def test_a_run_stopped_by_an_error_says_so_on_stderr(tmp_path, env, why):
    done = packrl("train", f"{HERE}:{env}", "--num-envs", "1", "--total-steps", "256", "--train.num_steps", "16",
                  "--no-live", "--out", str(tmp_path / "run"))
    assert done.returncode == 3, done.stderr
    stopped = [line for line in done.stderr.splitlines() if line.startswith("packrl train: training stopped: ")]
    assert len(stopped) == 1 and why in stopped[0], done.stderr
    assert "training stopped" not in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert f"run folder: {tmp_path / 'run'}" in done.stdout  # the results: where the run is


# ---------------------------------------------------------------- bad input, fast


@pytest.mark.parametrize(("args", "line"), [
    (["train", "--train.gamma", "1.5"], "packrl train: --train.gamma 1.5: expected a float in [0, 1] (train.gamma)"),
    (["train", "CartPol-v1"], "packrl train: unknown env 'CartPol-v1' (did you mean CartPole-v1"),
    (["check", "CartPol-v1"], "packrl check: unknown env 'CartPol-v1' (did you mean CartPole-v1"),
    (["eval", "runs/nope"], "packrl eval: checkpoint runs/nope: no such folder"),
    (["eval", "runs/nope", "--env-kwargs", "[1]"], "packrl eval: error: argument --env-kwargs: expected a table"),
    (["eval", "empty"], "packrl eval: checkpoint empty: holds no metadata.json and is not a run folder"),
    (["inspect", "runs/nope"], "packrl inspect: checkpoint runs/nope: no such folder"),
    (["plot", "runs/nope"], "packrl plot: runs/nope: no such folder"),
    (["train", "--resume", "runs/nope"], "packrl train: --resume runs/nope: no such run or checkpoint folder"),
])
def test_bad_input_is_one_line_before_torch_or_numba_is_imported(tmp_path, args, line):
    (tmp_path / "empty").mkdir()
    done = packrl(*args, cwd=tmp_path, modules=True)
    assert done.returncode == 2
    error, modules = done.stderr.strip().splitlines()
    assert error.startswith(line), done.stderr
    assert modules == "modules:", done.stderr  # neither torch nor numba
    assert done.stdout == ""


def test_a_file_in_place_of_a_checkpoint_folder_is_named_so(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"\0")
    done = packrl("eval", "model.pt", cwd=tmp_path, modules=True)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["packrl eval: checkpoint model.pt: not a folder (give a checkpoint folder or "
                                        "a run folder)", "modules:"]


def test_a_mistyped_command_names_the_close_one_and_every_command():
    done = packrl("tran")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "unknown command 'tran' (did you mean train?)" in line
    assert all(command in line for command in ("train", "eval", "inspect", "check", "configs", "plot"))


# ---------------------------------------------------------------- help


def _description(help_text: str) -> str:
    """The paragraph argparse prints after the usage lines."""
    return " ".join(help_text.split("\n\n")[1].split())


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["check"], ["configs"], ["plot"], ["inspect"]])
def test_every_help_description_is_whole_sentences_without_markup(command):
    done = packrl(*command, "--help")
    assert done.returncode == 0, done.stderr
    text = _description(done.stdout)
    assert text[0].isupper() and text.endswith(".") and "``" not in text and ":class:" not in text, text


def test_check_offers_only_the_settings_it_uses():
    text = packrl("check", "--help").stdout
    assert "--vec.num_envs" in text and "--policy.hidden" in text and "--seed" in text and "--env.kwargs" in text
    for unused in ("--train.learning_rate", "--total-steps", "--device", "--train.gamma", "training settings"):
        assert unused not in text, unused


def test_train_help_says_which_presets_change_a_default():
    text = " ".join(packrl("train", "--help").stdout.split())
    learning_rate = text[text.index("--train.learning_rate"):]
    assert re.search(r"default: 0\.00025; presets: [^)]*classic-control 0\.001", learning_rate), learning_rate[:400]
    assert "packrl configs" in text


# ---------------------------------------------------------------- eval


@pytest.fixture(scope="module")
def repeat_checkpoint(tmp_path_factory):
    return save_untrained(tmp_path_factory.mktemp("repeat") / "checkpoint", f"{HERE}:repeat_env")


def test_eval_takes_env_kwargs_as_train_does(tmp_path):
    checkpoint = save_untrained(tmp_path / "checkpoint")
    for kwargs, env in (("{max_episode_steps = 3}", ["--env", "CartPole-v1"]),  # TOML as train
                        ('{"max_episode_steps": 3}', ["--env", "CartPole-v1"]),  # JSON as before
                        ("{max_episode_steps = 3}", [])):  # over the recorded env's kwargs (they were dropped)
        done = packrl("eval", str(checkpoint), "--episodes", "4", *env, "--env-kwargs", kwargs)
        assert done.returncode == 0, done.stderr
        rows = [line for line in done.stdout.splitlines() if line.strip().startswith(("│ sampled", "│ greedy"))]
        assert len(rows) == 2 and all("4 of 4" in row for row in rows), done.stdout  # 3 steps: every episode cut


def test_eval_shows_progress_on_a_terminal_and_only_results_in_a_pipe(repeat_checkpoint):
    args = ["eval", str(repeat_checkpoint), "--episodes", "16", "--num-envs", "4", "--env", f"{HERE}:repeat_env"]
    rc, text = run_on_pty([sys.executable, "-m", "packrl", *args])
    assert rc == 0, text[-3000:]
    lines = [line.strip() for line in text.replace("\r\n", "\n").splitlines()]
    assert lines[0].startswith(f"eval: {repeat_checkpoint}: loading"), lines
    assert lines[1] == f"eval: {HERE}:repeat_env, 16 episodes per mode (sampled, then greedy) on 4 envs", lines
    for mode in ("sampled", "greedy"):
        progress = [line for line in lines if line.startswith(f"eval: {mode} ")]
        assert len(progress) >= 2 and re.fullmatch(rf"eval: {mode} 16/16 episodes, [\d.]+ s", progress[-1]), lines
    assert text.index("eval: greedy 16/16") < text.index("mean return")
    piped = packrl(*args)  # a log or a pipe: the results, and nothing on stderr
    assert piped.returncode == 0 and piped.stderr == "" and "mean return" in piped.stdout, piped.stderr


def test_make_demo_speaks_at_once_on_a_terminal(tmp_path):
    """The demo's train says it is starting before torch and the envs are loaded, and its eval says it is loading
    before the table."""
    rc, text = run_on_pty([sys.executable, "examples/train_demo.py", "--total-steps", "1024", "--out",
                           str(tmp_path / "demo")])
    assert rc == 0, text[-3000:]
    assert text.index("packrl train: starting gridworld: importing torch") < text.index("preset: gridworld"), text[:2000]
    assert text.index(f"eval: {tmp_path / 'demo' / 'checkpoint'}: loading") < text.index("mean return"), text[-3000:]


def test_the_time_limit_note_is_silent_where_the_limit_is_the_best_outcome(repeat_checkpoint):
    """A greedy policy that holds the one action rewarded each step runs every episode to the time limit, with the
    best return (a perfect CartPole): no note. Where the loop earns nothing, the note says what it cost."""
    kept = packrl("eval", str(repeat_checkpoint), "--episodes", "8", "--env", f"{HERE}:repeat_env")
    assert kept.returncode == 0, kept.stderr
    greedy = next(line for line in kept.stdout.splitlines() if "│ greedy" in line)
    assert "10.000" in greedy and "8 of 8" in greedy, kept.stdout
    assert "note:" not in kept.stdout
    looped = packrl("eval", str(repeat_checkpoint), "--episodes", "8", "--env", f"{HERE}:loop_env")
    assert looped.returncode == 0, looped.stderr
    note = " ".join(looped.stdout[looped.stdout.index("note:"):].split())
    assert note.startswith("note: 8 more greedy than sampled episodes ran to the time limit, scoring 0.000 on "
                           "average against the sampled mean 1.000"), note


def test_eval_of_a_game_counts_episodes_where_it_says_episodes(tmp_path):
    checkpoint = save_untrained(tmp_path / "checkpoint", "pettingzoo.classic.tictactoe_v3")
    done = packrl("eval", str(checkpoint), "--episodes", "6")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "6 episodes per mode (2 agents each: the returns are per agent)" in text
    assert text.count("0 of 6") == 2 and "of 12" not in text, text


def test_eval_and_check_use_one_torch_thread(tmp_path):
    checkpoint = save_untrained(tmp_path / "checkpoint")
    script = ("import sys, torch\ntorch.set_num_threads(2)\nfrom packrl.cli import main\n"
              "rc = main(sys.argv[1:])\nprint('threads', torch.get_num_threads(), file=sys.stderr)\nsys.exit(rc)\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    for args in (["eval", str(checkpoint), "--episodes", "2"], ["check", "CartPole-v1", "--steps", "4"]):
        done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)  # quiet: the whole test takes 4 s
        assert done.returncode == 0, done.stderr
        assert done.stderr.splitlines()[-1] == "threads 1", done.stderr


# ---------------------------------------------------------------- train's closing lines and small things


@pytest.mark.parametrize("every", [["--versus-every", "1"], []])
def test_a_zero_sum_game_closes_on_its_score(tmp_path, every):
    """With checks every iteration, and with the default interval (10) in a run shorter than it: the last
    iteration's check gives the closing score (such a run closed on 'last mean episode return 0.000')."""
    done = packrl("train", "pettingzoo.classic.tictactoe_v3", "--total-steps", "1024", "--train.num_steps", "32",
                  *every, "--versus-games", "4", "--no-live", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert re.search(r"^against a uniformly random legal opponent \(iteration \d+, step [\d,]+\): win \d\.\d\d, "
                     r"draw \d\.\d\d, loss \d\.\d\d, reward per game [-+]\d\.\d{3} ± \d\.\d{3} \(95%\)$", text, re.M), text
    if every:
        assert re.search(r"^against the previous check's policy \(iteration \d+", text, re.M), text
    assert "last mean episode return" not in text
    progress = [line for line in text.splitlines() if "steps/s mean" in line]
    assert progress and "vs random win/draw/loss" in progress[-1], text  # the log line leads with the score


def test_a_total_below_one_iteration_stops_at_100_percent_and_one_row_is_one_row(tmp_path):
    done = packrl("train", f"{HERE}:repeat_env", "--num-envs", "1", "--total-steps", "10", "--train.num_steps", "16",
                  "--no-live", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "(1 row, cpu)" in done.stdout, done.stdout
    progress = [line for line in done.stdout.splitlines() if "steps/s mean" in line]
    assert progress and re.match(r"\[\s+16/10 100\.0%\]", progress[-1]), done.stdout


def test_train_without_an_env_names_the_env_it_picked(tmp_path):
    done = packrl("train", "--total-steps", "64", "--num-envs", "2", "--train.num_steps", "32", "--no-live",
                  "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == ("packrl train: no ENV given: training 'gridworld', packrl's default env.id "
                                           "(name one: packrl train CartPole-v1)")


# ---------------------------------------------------------------- other libraries' noise, and check's words


def test_check_names_the_dtype_of_the_rows_the_policy_reads():
    done = packrl("check", "CartPole-v1", "--num-envs", "8", "--steps", "4")
    assert done.returncode == 0, done.stderr
    assert "float32 rows (8, 4)" in done.stdout and "uint8 rows" not in done.stdout, done.stdout


def test_babyai_rejection_sampling_prints_nothing():
    """BabyAI-PickupLoc-v0 rejects 4 missions over the resets of seeds 0-15 and prints each rejection."""
    done = packrl("check", "BabyAI-PickupLoc-v0", "--num-envs", "16", "--steps", "8")
    assert done.returncode == 0, done.stderr
    assert "Sampling rejected" not in done.stdout + done.stderr


def test_eval_render_without_a_display_prints_no_sdl_line(tmp_path):
    checkpoint = save_untrained(tmp_path / "checkpoint")
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "packrl", "eval", str(checkpoint), "--episodes", "2", "--render",
                           str(tmp_path / "episode.gif")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # quiet: the whole test takes 2 s
    assert done.returncode == 0, done.stderr
    assert "XDG_RUNTIME_DIR" not in done.stdout + done.stderr and (tmp_path / "episode.gif").is_file()
    assert done.stderr == ""  # not a terminal: no progress lines either


@pytest.mark.parametrize("game", [False, True])
def test_the_learning_curve_legend_sits_outside_the_data(tmp_path, monkeypatch, game):
    import matplotlib.pyplot as plt

    from packrl.train.plot import plot_learning_curve

    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # keep the figure the curve was drawn on
    history = [{"global_step": 64 * i, "episode_return": float(i % 7), **({"vs_random/win": i / 40} if game else {})}
               for i in range(1, 41)]
    assert plot_learning_curve(history, tmp_path / "curve.png", "run") is not None
    (fig,) = drawn
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = fig.legends + [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    assert len(legends) == 1 and len(legends[0].get_texts()) == (3 if game else 2)  # one legend for both axes
    box = legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer)), (box, ax.get_window_extent(renderer))
    plt.close(fig)


def test_inspect_counts_one_leaf_as_one_leaf(tmp_path):
    checkpoint = save_untrained(tmp_path / "checkpoint")  # CartPole: one Box observation leaf
    done = packrl("inspect", str(checkpoint))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert re.search(r"observation layout: \d+ bytes, 1 leaf\b", text) and "1 leaves" not in text, text
