"""``packrl train --resume`` checks what ``packrl eval`` checks (layouts, architecture, distributed shape) through
one shared function; a resume with nothing to train is refused with nothing written; resume errors name the
real mismatch; same seed, same printed checkpoint hash; one hash pass of the weights per eval command.

The resume cases drive the command line as a user types it (``.venv/bin/packrl train ...`` in a subprocess)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from packrl.checkpoint import manifest_sha256

ROOT = Path(__file__).resolve().parents[1]
PACKRL = [sys.executable, "-m", "packrl"]
HIGH = "PACKRL_TEST_BOX_HIGH"  # the env's Box bound, read when it is made: the env "changed" between two commands


class Bounded(gym.Env):
    """A Box observation whose upper bound comes from the environment variable HIGH (default 1)."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, float(os.environ.get(HIGH, "1")), (2,), np.float32)
        self.t = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(2, 0.5, np.float32), float(action), False, self.t >= 8, {}


def bounded_env():
    return Bounded()


def packrl(*args: str, high: str = "1", timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, HIGH: high, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*PACKRL, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def _train_bounded(out: Path, *extra: str, high: str = "1") -> subprocess.CompletedProcess:
    return packrl("train", "tests.test_resume_checks:bounded_env", "--num-envs", "2", "--train.num_steps", "8",
                  "--hidden", "8", "--total-steps", "32", "--seed", "1", "--no-live", "--checkpoint-minutes", "0",
                  "--out", str(out), *extra, high=high)


def _resume_bounded(run: Path, *extra: str, high: str = "1") -> subprocess.CompletedProcess:
    return packrl("train", "tests.test_resume_checks:bounded_env", "--resume", str(run), "--no-live", *extra,
                  high=high)


def _snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_exit_2(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("packrl train: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


@pytest.fixture(scope="module")
def bounded_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "run"
    done = _train_bounded(out)
    assert done.returncode == 0, done.stderr
    return out


def test_resume_refuses_an_env_whose_box_bounds_differ_from_the_recorded_ones_as_eval_does(bounded_run):
    before = _snapshot(bounded_run)
    line = _one_line_exit_2(_resume_bounded(bounded_run, "--total-steps", "64", high="2"))
    assert "layouts.observation differs from the env's" in line and "high" in line, line
    assert _snapshot(bounded_run) == before  # refused before anything was written
    done = packrl("eval", str(bounded_run), "--env", "tests.test_resume_checks:bounded_env", "--episodes", "1",
                  high="2")
    assert done.returncode == 2 and "layouts.observation differs from the env's" in done.stderr


def test_resume_refuses_a_resigned_checkpoint_whose_layout_is_not_a_layout(bounded_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(bounded_run, run)
    meta_file = run / "checkpoint" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["layouts"]["observation"] = {"leaves": "not a layout"}
    meta["sha256"] = manifest_sha256(meta)  # the manifest hash is no secret: an attacker re-signs it
    meta_file.write_text(json.dumps(meta))
    before = _snapshot(run)
    line = _one_line_exit_2(_resume_bounded(run, "--total-steps", "64"))
    assert "layouts.observation" in line and "not a layout" in line, line
    assert _snapshot(run) == before


@pytest.mark.parametrize("total", ["32", "16"])
def test_resume_with_total_steps_at_or_below_the_checkpoint_step_is_one_line_and_writes_nothing(bounded_run, total):
    before = _snapshot(bounded_run)
    line = _one_line_exit_2(_resume_bounded(bounded_run, "--total-steps", total))
    assert "the run is at step 32" in line and "nothing to train" in line, line
    assert _snapshot(bounded_run) == before


def test_resume_of_a_finished_run_without_total_steps_is_refused(bounded_run):
    before = _snapshot(bounded_run)
    line = _one_line_exit_2(_resume_bounded(bounded_run))
    assert "recorded total_steps (32)" in line and "give --total-steps above 32" in line, line
    assert _snapshot(bounded_run) == before


def test_resume_on_another_env_names_the_env_not_the_backend(tmp_path):
    """A Numba gridworld run resumed with a MiniGrid id: the env differs from the run's, and a resume cannot
    change the backend, so no advice about backends."""
    out = tmp_path / "g"
    done = packrl("train", "gridworld", "--num-envs", "2", "--train.num_steps", "16", "--hidden", "8",
                  "--total-steps", "32", "--no-live", "--checkpoint-minutes", "0", "--out", str(out))
    assert done.returncode == 0, done.stderr
    before = _snapshot(out)
    line = _one_line_exit_2(packrl("train", "MiniGrid-Empty-5x5-v0", "--resume", str(out), "--total-steps", "64",
                                   "--no-live"))
    assert "the env 'MiniGrid-Empty-5x5-v0' differs from the run's 'gridworld'" in line, line
    assert "serial or multiprocessing" not in line
    assert _snapshot(out) == before


def _printed_sha256(text: str) -> str:
    return re.search(r"checkpoint: .* \(sha256 ([0-9a-f]{64})\)", text).group(1)


def test_same_seed_runs_print_the_same_checkpoint_sha256(tmp_path, capsys):
    from packrl.cli import main

    args = ["train", "gridworld", "--num-envs", "2", "--total-steps", "64", "--train.num_steps", "16", "--hidden",
            "8", "--no-live", "--checkpoint-minutes", "0"]
    hashes, weights = [], []
    for name in "ab":
        assert main([*args, "--seed", "4", "--out", str(tmp_path / name)]) == 0
        hashes.append(_printed_sha256(capsys.readouterr().out))
        weights.append((tmp_path / name / "checkpoint" / "model.safetensors").read_bytes())
    assert weights[0] == weights[1]  # byte-identical weights ...
    assert hashes[0] == hashes[1]  # ... give the same printed hash (no save time in what is hashed)
    assert main([*args, "--seed", "5", "--out", str(tmp_path / "c")]) == 0
    assert _printed_sha256(capsys.readouterr().out) != hashes[0]


@pytest.mark.parametrize("render", [False, True])
def test_eval_hashes_the_weights_once_per_command_render_included(tmp_path, monkeypatch, capsys, render):
    import packrl.checkpoint as checkpoint_module
    from packrl.cli import main
    from tests.saved_policies import save_untrained

    path = save_untrained(tmp_path / "checkpoint")
    calls = []
    real = checkpoint_module.hash_weights
    monkeypatch.setattr(checkpoint_module, "hash_weights", lambda data: calls.append(len(data)) or real(data))
    sha = json.loads((path / "metadata.json").read_text())["sha256"]
    extra = ["--render", str(tmp_path / "episode.gif")] if render else []
    assert main(["eval", str(path), "--episodes", "2", "--sha256", sha, *extra]) == 0
    assert calls == [(path / "model.safetensors").stat().st_size]  # one pass over the weights, render included
    assert (tmp_path / "episode.gif").is_file() == render


def test_resume_hashes_the_weights_once(tmp_path, monkeypatch, capsys):
    import packrl.checkpoint as checkpoint_module
    from packrl.cli import main

    out = tmp_path / "run"
    assert main(["train", "gridworld", "--num-envs", "2", "--total-steps", "32", "--train.num_steps", "16",
                 "--hidden", "8", "--no-live", "--checkpoint-minutes", "0", "--out", str(out)]) == 0
    calls = []
    real = checkpoint_module.hash_weights
    monkeypatch.setattr(checkpoint_module, "hash_weights", lambda data: calls.append(len(data)) or real(data))
    size = (out / "checkpoint" / "model.safetensors").stat().st_size
    assert main(["train", "--resume", str(out / "checkpoint"), "--total-steps", "64", "--no-live"]) == 0
    assert calls == [size]  # verified once; the layouts, architecture and weights all come from that read


def test_a_run_folder_is_hashed_once_per_command(tmp_path, monkeypatch, capsys):
    """A run folder's newest checkpoint is verified when it is chosen; resume, eval and inspect build from that
    read (issue 38: one hash pass per command)."""
    import packrl.checkpoint as checkpoint_module
    from packrl.cli import main

    out = tmp_path / "run"
    assert main(["train", "gridworld", "--num-envs", "2", "--total-steps", "32", "--train.num_steps", "16",
                 "--hidden", "8", "--no-live", "--checkpoint-minutes", "0", "--out", str(out)]) == 0
    calls = []
    real = checkpoint_module.hash_weights
    monkeypatch.setattr(checkpoint_module, "hash_weights", lambda data: calls.append(len(data)) or real(data))
    size = (out / "checkpoint" / "model.safetensors").stat().st_size
    for argv in (["train", "--resume", str(out), "--total-steps", "64", "--no-live"],
                 ["eval", str(out), "--episodes", "2"],
                 ["inspect", str(out)]):
        calls.clear()
        assert main(argv) == 0, argv
        assert calls == [(out / "checkpoint" / "model.safetensors").stat().st_size], argv
    assert size > 0
