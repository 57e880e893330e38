"""matplotlib and pettingzoo are extras ([plot], [pettingzoo]): packrl imports, trains and saves without them.

Each test runs ``packrl`` in a real subprocess in which those packages cannot be imported
(tests/blocked_imports.py: the ModuleNotFoundError a missing package gives), then checks what a user sees."""
import json
import subprocess
import sys

from tests.blocked_imports import ROOT, environment

PLOT_LINE = "learning curve: not drawn, matplotlib is not installed"


# quiet: this file's tests take at most 7 s
def packrl(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "packrl", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


def test_a_run_without_matplotlib_writes_its_history_and_says_how_to_plot_it(tmp_path):
    env = environment(tmp_path / "site", {"matplotlib", "pettingzoo"})
    run = tmp_path / "run"
    done = packrl(["train", "cartpole", "--total-steps", "2048", "--out", str(run), "--no-live"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert rows[-1]["global_step"] == 2048 and any("episode_return" in r for r in rows)
    assert not (run / "learning_curve.png").exists()
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("learning curve:")]
    assert line.startswith(PLOT_LINE) and line.endswith(f"pip install 'packrl[plot]', then packrl plot {run}"), line
    assert (run / "checkpoint").is_dir()

    refused = packrl(["plot", str(run)], env)  # still without matplotlib: one line naming the extra
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "pip install 'packrl[plot]'" in refused.stderr, refused.stderr

    drawn = packrl(["plot", str(run)], {**env, "PYTHONPATH": str(ROOT)})  # the command the line names, with matplotlib
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    assert drawn.stdout.strip() == f"learning curve: {run / 'learning_curve.png'}"
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_with_matplotlib_the_run_draws_its_curve_and_names_it(tmp_path):
    """The control: the same run where matplotlib imports draws the curve (so the test above can fail)."""
    env = environment(tmp_path / "site", {"pettingzoo"})
    run = tmp_path / "run"
    done = packrl(["train", "cartpole", "--total-steps", "2048", "--out", str(run), "--no-live"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"learning curve: {run / 'learning_curve.png'}" in done.stdout.splitlines()
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_packrl_plot_refuses_what_is_not_a_run_in_one_line(tmp_path):
    env = environment(tmp_path / "site", set())
    for args in (["plot", str(tmp_path / "missing")], ["plot"], ["plot", str(tmp_path), "--bogus"]):
        done = packrl(args, env)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, (args, done.stderr)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "history.jsonl").write_text('{"iteration": 1, "global_step": 64}\n')
    nothing = packrl(["plot", str(tmp_path / "empty")], env)  # no episode ended: nothing drawn, said so
    assert nothing.returncode == 1 and "nothing to draw" in nothing.stderr


CORE = """
import sys
import gymnasium as gym
import numpy as np
import packrl, packrl.cli, packrl.train.run, packrl.train.session, packrl.models
from packrl import vector
from packrl.emulation import emulate
envs = vector.make(lambda: gym.make("CartPole-v1"), 4, backend="serial", seed=0)
envs.reset()
envs.step(np.zeros(4, dtype=np.int64))
try:
    emulate(object())
except packrl.EmulationError as err:
    print(err)
print(sorted(m for m in ("pettingzoo", "matplotlib") if m in sys.modules))
"""


def test_packrl_core_imports_and_steps_without_pettingzoo(tmp_path):
    env = environment(tmp_path / "site", {"matplotlib", "pettingzoo"})
    done = subprocess.run([sys.executable, "-c", CORE], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600)  # quiet: the whole test takes 2 s
    assert done.returncode == 0, done.stderr[-3000:]
    refused, loaded = done.stdout.strip().splitlines()[-2:]
    assert refused.startswith("emulate takes a gymnasium.Env") and loaded == "[]"
    named = packrl(["train", "pettingzoo.classic.tictactoe_v3", "--total-steps", "64", "--out", str(tmp_path / "r")], env)
    assert named.returncode == 2 and "pip install 'packrl[pettingzoo]'" in named.stderr, named.stderr
    assert named.stderr.count("\n") == 1 and not (tmp_path / "r").exists()
