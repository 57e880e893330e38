"""packrl sweep end to end on its default SQLite study: real trial processes training packrl's Numba cartpole,
best.toml that packrl train reproduces bit for bit, show's tables and PNGs, pruning, the same seed giving the same
trials, bad input as one line with exit 2, and SIGKILL/SIGTERM of a trial and of the sweep itself."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPACE = """defaults = false
[train]
learning_rate = { low = 1e-4, high = 3e-2 }
clip_coef = { low = 0.1, high = 0.3 }
num_steps = 32
update_epochs = 2
[vec]
num_envs = 8
"""
BUDGET = "2048"  # 8 iterations of 8 envs x 32 steps


# quiet: this file's tests take at most 26 s
def packrl(*args, timeout=600, **kwargs):
    return subprocess.run([sys.executable, "-m", "packrl", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, **kwargs)


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "packrl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)


def trials(folder):
    """(number, state, failure, cut reason, params) of every trial in the sweep's SQLite study."""
    with sqlite3.connect(folder / "study.db") as db:
        rows = db.execute("select trial_id, number, state from trials order by number").fetchall()
        attrs = {(t, k): json.loads(v) for t, k, v in db.execute("select trial_id, key, value_json from trial_user_attributes")}
        params = {}
        for t, name, value in db.execute("select trial_id, param_name, param_value from trial_params"):
            params.setdefault(t, {})[name] = value
    return [(n, s, attrs.get((t, "failure")), attrs.get((t, "cut")), params.get(t, {})) for t, n, s in rows]


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    path = tmp_path_factory.mktemp("space") / "space.toml"
    path.write_text(SPACE)
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory, space):
    """A sweep of 3 trials, 2 at a time."""
    out = tmp_path_factory.mktemp("sweep") / "s"
    done = packrl("sweep", "cartpole", "--trials", "3", "--jobs", "2", "--budget", BUDGET, "--space", str(space),
                  "--pruner", "none", "--out", str(out), "--no-live")
    assert done.returncode == 0, done.stderr
    return out, done


def test_each_trial_is_a_run_folder_and_best_toml_trains_the_best_trial_again(finished, tmp_path):
    out, done = finished
    states = trials(out)
    assert [(n, s) for n, s, *_ in states] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    assert "trial 0 started" in done.stdout and "3/3 finished" in done.stdout and "ETA" in done.stdout
    for n in range(3):
        run = out / "trials" / f"{n:04d}"
        assert (run / "checkpoint" / "metadata.json").is_file()
        rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
        assert rows[-1]["global_step"] == 2048
    best = (out / "best.toml").read_text()
    number = int(best.split("best trial ")[1].split()[0])
    again = packrl("train", "--config", str(out / "best.toml"), "--out", str(tmp_path / "again"), "--no-live")
    assert again.returncode == 0, again.stderr
    original = json.loads((out / "trials" / f"{number:04d}" / "checkpoint" / "metadata.json").read_text())
    retrained = json.loads((tmp_path / "again" / "checkpoint" / "metadata.json").read_text())
    assert retrained["sha256"] == original["sha256"]  # same settings, same seed: the same weights
    evaluated = packrl("eval", str(out / "trials" / f"{number:04d}"), "--episodes", "2")
    assert evaluated.returncode == 0, evaluated.stderr


def test_show_prints_the_best_trials_and_the_pareto_front_and_writes_pngs(finished):
    out, _ = finished
    shown = packrl("sweep", "show", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "best trials" in shown.stdout and "Pareto front" in shown.stdout
    for name in ("optimization_history", "slice", "pareto", "param_importances"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, name


def test_a_symlink_in_place_of_a_sweep_file_is_refused_and_its_target_kept(finished, space, tmp_path):
    """sweep.json and best.toml are written as every file packrl writes: atomically, never through a symlink."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    out = tmp_path / "s"
    out.mkdir()
    (out / "sweep.json").symlink_to(victim)
    done = packrl("sweep", "cartpole", "--trials", "1", "--budget", BUDGET, "--space", str(space), "--out", str(out),
                  "--no-live")
    assert done.returncode == 2 and "symlink" in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr
    assert victim.read_text() == "the user's file\n"
    finished_out, _ = finished
    (finished_out / "best.toml").unlink()
    (finished_out / "best.toml").symlink_to(victim)
    try:
        shown = packrl("sweep", "show", str(finished_out))
        assert shown.returncode == 2 and "symlink" in shown.stderr, shown.stderr
        assert victim.read_text() == "the user's file\n"
    finally:
        (finished_out / "best.toml").unlink()
        assert packrl("sweep", "show", str(finished_out)).returncode == 0  # best.toml written again, for the others



@pytest.mark.parametrize("name", ["sweep.lock", "study.db"])
def test_a_symlink_in_place_of_the_lock_or_the_database_is_refused(space, tmp_path, name):
    """The lock file (rewritten with the sweep's pid) and SQLite's study.db (made where a symlink points, journal
    beside it) are refused as symlinks too: one line, exit 2, and nothing written where the link points."""
    victim, elsewhere = tmp_path / "victim.txt", tmp_path / "elsewhere" / "new.db"
    victim.write_text("the user's file\n")
    elsewhere.parent.mkdir()
    out = tmp_path / "s"
    out.mkdir()
    (out / name).symlink_to(victim if name == "sweep.lock" else elsewhere)
    done = packrl("sweep", "cartpole", "--trials", "1", "--budget", BUDGET, "--space", str(space), "--out", str(out),
                  "--no-live")
    assert done.returncode == 2 and "symlink" in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr
    assert victim.read_text() == "the user's file\n" and list(elsewhere.parent.iterdir()) == []


def test_the_same_seed_proposes_the_same_first_trials_and_another_seed_others(finished, space, tmp_path):
    out, _ = finished
    first = [p for *_, p in trials(out)]
    again = packrl("sweep", "cartpole", "--trials", "1", "--budget", BUDGET, "--space", str(space), "--pruner", "none",
                   "--out", str(tmp_path / "again"), "--no-live")
    other = packrl("sweep", "cartpole", "--trials", "1", "--budget", BUDGET, "--space", str(space), "--pruner", "none",
                   "--out", str(tmp_path / "other"), "--seed", "1", "--no-live")
    assert again.returncode == 0 and other.returncode == 0, again.stderr + other.stderr
    assert [p for *_, p in trials(tmp_path / "again")] == first[:1]
    assert [p for *_, p in trials(tmp_path / "other")] != first[:1]


def test_bad_input_is_one_line_and_exit_2(finished, space, tmp_path):
    out, _ = finished
    bad_space = tmp_path / "bad.toml"
    bad_space.write_text("[train]\nlearning_rate = { low = 1e-3, high = 1e-4 }\n")
    other_space = tmp_path / "other.toml"
    other_space.write_text(SPACE.replace("high = 0.3", "high = 0.35"))
    cases = [
        (["--space", str(other_space), "--budget", BUDGET, "--out", str(out)], "exists with another space"),
        (["--space", str(space), "--budget", "4096", "--out", str(out)], "exists with another budget"),
        (["--space", str(bad_space)], "low 0.001 > high 0.0001"),
        (["--budget", "100"], "smaller than one iteration"),
        (["--objective", "steps-to:x"], "--objective"),
        (["--storage", "postgresql://who:s3cret-word@127.0.0.1:1/db"], "does not answer"),
        (["--space", str(space), "--budget", BUDGET, "--out", str(out), "--objective", "steps-to:100"],
         "exists with another objective"),
    ]
    for extra, words in cases:
        done = packrl("sweep", "cartpole", *extra, timeout=60)  # quiet: the whole test takes 3 s
        assert done.returncode == 2, (extra, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, (extra, done.stderr)
        assert "s3cret-word" not in done.stderr + done.stdout
    unknown_env = packrl("sweep", "NoSuchEnv-v9", "--budget", BUDGET)
    assert unknown_env.returncode == 2 and len(unknown_env.stderr.strip().splitlines()) == 1
    assert packrl("sweep", "show", str(tmp_path)).returncode == 2


PRUNING_SPACE = """defaults = false
[train]
learning_rate = { choices = [1e-7, 1e-3] }
[vec]
num_envs = 8
"""
PRUNING_BUDGET = 24576
STARTUP = 3  # study.make_pruner: the median pruner judges no trial before 3 have finished


def test_median_pruning_stops_weak_trials_early_with_a_checkpoint(tmp_path):
    """A trial that cannot learn (learning rate 1e-7: CartPole's random play, about 22) is stopped before the budget
    once the finished learners (1e-3, the classic-control preset's rate: 475 at 32k-48k) are above it. The seeded
    random sampler's draws are the same on every machine; the training curves are not, so the learners' margin
    (about 100 by 12k steps against a non-learner's best of about 35) is what carries the test."""
    (tmp_path / "space.toml").write_text(PRUNING_SPACE)
    out = tmp_path / "pruned"
    done = packrl("sweep", "cartpole", "--trials", "5", "--budget", str(PRUNING_BUDGET), "--space",
                  str(tmp_path / "space.toml"), "--sampler", "random", "--pruner", "median", "--out", str(out),
                  "--no-live")
    assert done.returncode == 0, done.stderr
    rows = trials(out)
    learners = [n for n, _, _, _, params in rows if params["train.learning_rate"] == 1]  # categorical: the choice's index
    assert sum(n < STARTUP for n in learners) >= 2, rows  # the seed's draws: the median of the first 3 is a learner
    weak_after_startup = [n for n, *_ in rows if n >= STARTUP and n not in learners]
    assert weak_after_startup, rows
    for n in weak_after_startup:
        assert rows[n][1] == "PRUNED", (rows, done.stdout)
        history = [json.loads(line) for line in (out / "trials" / f"{n:04d}" / "history.jsonl").read_text().splitlines()]
        assert history[-1]["global_step"] < PRUNING_BUDGET
        assert (out / "trials" / f"{n:04d}" / "checkpoint" / "metadata.json").is_file()


def test_a_steps_to_trial_stops_once_it_reaches_the_threshold(tmp_path):
    """With --objective steps-to, a trial's value is known the moment its mean return reaches the threshold: it stops
    there (a checkpoint saved), COMPLETE, its value the steps it took; one that never reaches it runs the budget.
    The learning rates are the preset's neighbourhood, where CartPole passes 40 within about 10k steps."""
    (tmp_path / "space.toml").write_text(PRUNING_SPACE.replace("choices = [1e-7, 1e-3]", "low = 5e-4, high = 2e-3"))
    out = tmp_path / "reach"
    done = packrl("sweep", "cartpole", "--trials", "3", "--budget", "16384", "--space", str(tmp_path / "space.toml"),
                  "--pruner", "none",
                  "--objective", "steps-to:40", "--out", str(out), "--no-live")
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(out / "study.db") as db:
        values = dict(db.execute("select t.number, v.value from trials t join trial_values v using (trial_id)"))
    assert len(values) == 3 and all(s == "COMPLETE" for _, s, *_ in trials(out))
    stopped = 0
    for n, value in values.items():
        rows = [json.loads(line) for line in (out / "trials" / f"{n:04d}" / "history.jsonl").read_text().splitlines()]
        last = rows[-1]["global_step"]
        assert (out / "trials" / f"{n:04d}" / "checkpoint" / "metadata.json").is_file()
        if value < 16384:  # reached: it stopped after that step (CartPole's iterations take milliseconds, the
            assert value <= last, (value, last)  # watcher reads the history every 50 ms: some ran on past it)
            stopped += last < 16384
    assert stopped >= 1, values  # CartPole's random play scores about 22: 40 is reached early


def _children(pid):
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_for(condition, seconds=120):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


def _history_rows(out, number):
    path = out / "trials" / f"{number:04d}" / "history.jsonl"
    return path.is_file() and path.read_text().count("\n") >= 2


def test_sigkill_of_a_trial_and_of_the_sweep_loses_no_finished_trial_and_a_rerun_continues(space, tmp_path):
    out = tmp_path / "killed"
    args = ["sweep", "cartpole", "--trials", "3", "--budget", BUDGET, "--space", str(space), "--pruner", "none",
            "--out", str(out), "--no-live"]
    sweep = start(*args)
    _wait_for(lambda: _history_rows(out, 0))
    os.kill(_children(sweep.pid)[0], signal.SIGKILL)  # trial 0's process
    _wait_for(lambda: any(s == "COMPLETE" for _, s, *_ in trials(out)))  # trial 1 finishes
    _wait_for(lambda: _history_rows(out, 2))
    child = _children(sweep.pid)[0]
    sweep.kill()  # SIGKILL of the sweep while trial 2 trains
    sweep.wait()
    _wait_for(lambda: not Path(f"/proc/{child}").exists(), 60)  # the orphaned trial stops by itself
    before = trials(out)
    assert [(n, s) for n, s, *_ in before] == [(0, "FAIL"), (1, "COMPLETE"), (2, "RUNNING")]
    assert before[0][2:4] == ("cut", "killed by SIGKILL")
    finished_history = (out / "trials" / "0001" / "history.jsonl").read_bytes()
    again = packrl(*args)
    assert again.returncode == 0, again.stderr
    assert "marked failed (cut mid-way by a killed sweep): trial 2" in again.stdout
    after = trials(out)
    assert [(n, s) for n, s, *_ in after] == [(0, "FAIL"), (1, "COMPLETE"), (2, "FAIL"), (3, "COMPLETE"),
                                              (4, "COMPLETE")]
    assert (out / "trials" / "0001" / "history.jsonl").read_bytes() == finished_history  # never run again


def test_sigterm_stops_the_sweep_cleanly_and_the_cut_trial_keeps_its_checkpoint(space, tmp_path):
    out = tmp_path / "stopped"
    sweep = start("sweep", "cartpole", "--trials", "2", "--budget", "8192", "--space", str(space), "--pruner", "none",
                  "--out", str(out), "--no-live")
    _wait_for(lambda: _history_rows(out, 0))
    sweep.send_signal(signal.SIGTERM)
    stdout, stderr = sweep.communicate(timeout=120)  # quiet: the whole test takes 4 s
    assert sweep.returncode == 143, stderr
    assert "stopped by SIGTERM" in stderr and "rerun the same command" in stderr
    (number, state, failure, cut, _), = trials(out)
    assert (state, failure) == ("FAIL", "cut") and "SIGTERM" in cut
    assert (out / "trials" / "0000" / "checkpoint" / "metadata.json").is_file()


@pytest.mark.parametrize("omp, threads", [(None, "1"), ("3", "3")])
def test_trials_follow_the_thread_policy_of_train_eval_and_check(monkeypatch, omp, threads):
    """A trial runs its math libraries on one thread, or on what the sweep's OMP_NUM_THREADS says (as ``packrl
    train``, ``eval`` and ``check`` do); it was one thread whatever the user set."""
    from packrl.sweep.storage import STORAGE_ENV, child_environment

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    env = child_environment("sqlite:///x.db")
    assert env[STORAGE_ENV] == "sqlite:///x.db"
    assert [env[n] for n in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")] \
        == [threads] * 4
