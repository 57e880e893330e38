"""Run folders and checkpoints that a user's typo or a hostile file cannot turn against the user: run names
that stay in their folder, --overwrite that deletes only packrl's own runs, writes that never follow a
symlink, bounded parsing of every file read, the architecture checked against the weights before allocation,
inspect output without terminal escapes, and eval falling back to the newest loadable checkpoint."""
import json
import os
import signal
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from packrl.checkpoint import MAX_JSON_DEPTH, CheckpointError, loads_bounded, manifest_sha256, read_metadata
from packrl.cli import main
from packrl.run_folders import MARKER, RunError, newest_checkpoint, write_file

FAST = ["--num-envs", "2", "--total-steps", "64", "--train.num_steps", "32", "--hidden", "8", "--no-live"]


def _train(*args):
    return main(["train", "CartPole-v1", *FAST, *args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished CartPole run with checkpoint/ and one periodic checkpoint (copied by tests that edit it)."""
    out = tmp_path_factory.mktemp("safety") / "run"
    assert main(["train", "CartPole-v1", "--num-envs", "2", "--total-steps", "128", "--train.num_steps", "32",
                 "--hidden", "8", "--no-live", "--out", str(out), "--checkpoint-every", "64"]) == 0
    return out


def _copy(run, tmp_path):
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(run, target, symlinks=True)
    return target


def _resign(checkpoint: Path, change) -> None:
    """Edit a checkpoint's metadata and recompute its manifest hash, as an attacker with write access could."""
    meta = json.loads((checkpoint / "metadata.json").read_text())
    change(meta)
    meta["sha256"] = manifest_sha256(meta)
    (checkpoint / "metadata.json").write_text(json.dumps(meta))


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------- run names and --overwrite


@pytest.mark.parametrize("name", ["../..", "..", ".", "../escaped", "a/b", "", "x\x1b[31m", "/abs"])
def test_a_run_name_is_one_folder_name(tmp_path, monkeypatch, capsys, name):
    project = tmp_path / "project"
    (project / "runs").mkdir(parents=True)
    (project / "precious.txt").write_text("mine")
    monkeypatch.chdir(project / "runs")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert _train("--name", name, "--runs-dir", ".", "--overwrite") == 2
    assert "--name" in _one_line(capsys.readouterr().err)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert (project / "precious.txt").read_text() == "mine"


def test_a_run_folder_gets_the_marker_and_overwrite_needs_it(tmp_path, capsys):
    assert _train("--out", str(tmp_path / "r")) == 0
    assert (tmp_path / "r" / MARKER).is_file()
    assert _train("--out", str(tmp_path / "r"), "--overwrite") == 0
    # a folder that looks like a run (history.jsonl) but holds a user's file too, and no marker: kept
    lookalike = tmp_path / "lookalike"
    lookalike.mkdir()
    (lookalike / "history.jsonl").write_text("")
    (lookalike / "thesis.tex").write_text("mine")
    capsys.readouterr()
    assert _train("--out", str(lookalike), "--overwrite") == 2
    assert "thesis.tex" in _one_line(capsys.readouterr().err)
    assert (lookalike / "thesis.tex").read_text() == "mine"


def test_an_old_run_folder_without_the_marker_is_replaced_when_it_holds_only_packrl_files(tmp_path):
    assert _train("--out", str(tmp_path / "old")) == 0
    (tmp_path / "old" / MARKER).unlink()  # as packrl wrote run folders before the marker
    assert _train("--out", str(tmp_path / "old"), "--overwrite") == 0
    assert (tmp_path / "old" / MARKER).is_file()


def test_overwrite_never_deletes_the_current_folder_or_a_parent(tmp_path, monkeypatch, capsys):
    assert _train("--out", str(tmp_path / "r")) == 0
    (tmp_path / "r" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "r" / "sub")
    for target in (str(tmp_path / "r"), ".."):
        capsys.readouterr()
        assert _train("--out", target, "--overwrite") == 2
        assert "current folder or one above it" in _one_line(capsys.readouterr().err)
    assert (tmp_path / "r" / "checkpoint").is_dir()


def test_overwrite_refuses_a_symlinked_run_folder(tmp_path, capsys):
    assert _train("--out", str(tmp_path / "r")) == 0
    (tmp_path / "link").symlink_to(tmp_path / "r")
    assert _train("--out", str(tmp_path / "link"), "--overwrite") == 2
    assert "symlink" in _one_line(capsys.readouterr().err)
    assert (tmp_path / "r" / "checkpoint").is_dir()


# ---------------------------------------------------------------- symlinks inside a run folder


@pytest.mark.parametrize("name", ["history.jsonl", "learning_curve.png", "checkpoints", "checkpoint"])
def test_resume_refuses_a_symlink_where_the_run_writes(run, tmp_path, capsys, name):
    folder = _copy(run, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    target = folder / name
    if target.is_dir():
        import shutil

        shutil.rmtree(target)
    elif target.exists():
        target.unlink()
    target.symlink_to(victim)
    resumed = main(["train", "--resume", str(folder), "--total-steps", "192", "--no-live"])
    out = capsys.readouterr()
    assert resumed == 2, out
    assert "symlink" in _one_line(out.err)
    assert victim.read_text() == "mine"


def test_write_file_is_atomic_and_never_follows_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a.png").symlink_to(victim)
    with pytest.raises(RunError, match="symlink"):
        write_file(tmp_path / "run", "a.png", b"x")
    (tmp_path / "run" / "sub").symlink_to(tmp_path)
    with pytest.raises(RunError, match="symlink"):
        write_file(tmp_path / "run", "sub/b.png", b"x")
    for bad in ("../x", "/etc/x", "a/../../x"):
        with pytest.raises(RunError):
            write_file(tmp_path / "run", bad, b"x")
    write_file(tmp_path / "run", "h.jsonl", "one\n")
    write_file(tmp_path / "run", "h.jsonl", "two\n")
    assert (tmp_path / "run" / "h.jsonl").read_text() == "two\n"
    assert victim.read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["a.png", "h.jsonl", "sub"]  # no temporaries left


def test_a_history_tmp_symlink_is_not_followed(run, tmp_path):
    folder = _copy(run, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (folder / "history.jsonl.tmp").symlink_to(victim)
    assert main(["train", "--resume", str(folder), "--total-steps", "192", "--no-live"]) == 0
    assert victim.read_text() == "mine"


# ---------------------------------------------------------------- bounded parsing


def test_json_depth_and_size_are_checked_before_parsing():
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(CheckpointError, match="nested 100000 deep"):
        loads_bounded(deep, "f")
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_bounded(ok, "f") is not None
    tricky = json.dumps({"s": "[[[[\\\"{{{{" * 1000, "t": [[1]]})  # brackets inside strings do not count
    assert loads_bounded(tricky, "f", max_depth=3)["t"] == [[1]]
    with pytest.raises(CheckpointError, match="larger than"):
        loads_bounded("[" + "1," * 100 + "1]", "f", max_bytes=50)
    with pytest.raises(CheckpointError, match="cannot read"):
        loads_bounded("1" * 5000, "f")  # more digits than int() converts


@pytest.mark.parametrize("command", ["inspect", "eval"])
def test_deeply_nested_metadata_is_one_line(run, tmp_path, capsys, command):
    folder = _copy(run, tmp_path)
    meta = (folder / "checkpoint" / "metadata.json").read_text()
    (folder / "checkpoint" / "metadata.json").write_text(meta[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main([command, str(folder / "checkpoint")]) == 2
    assert "nested 100001 deep" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["inspect", "eval"])
def test_deeply_nested_safetensors_header_is_one_line(run, tmp_path, capsys, command):
    folder = _copy(run, tmp_path)
    header = b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    weights = len(header).to_bytes(8, "little") + header
    (folder / "checkpoint" / "model.safetensors").write_bytes(weights)
    import hashlib

    _resign(folder / "checkpoint", lambda m: m.update(weights_sha256=hashlib.sha256(weights).hexdigest()))
    assert main([command, str(folder / "checkpoint")]) == 2
    assert "nested" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("network", ["lstm"])
def test_an_architecture_larger_than_its_weights_is_refused_before_allocation(run, tmp_path, network):
    """A re-signed checkpoint claiming hidden=16384 over tiny weights (an LSTM of 8 GiB): refused from the
    meta-device build, under a 3 GiB address-space limit, for eval and for --resume."""
    import subprocess
    import sys

    folder = _copy(run, tmp_path)
    for checkpoint in (folder / "checkpoint", *(folder / "checkpoints").iterdir()):
        _resign(checkpoint, lambda m: m["config"]["policy"].update(hidden=16384, network=network, critic="shared"))
    limit = "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); " \
            "from packrl.cli import main; sys.exit(main(sys.argv[1:]))"
    root = Path(__file__).resolve().parents[1]
    for args in (["eval", str(folder), "--episodes", "1"],
                 ["train", "--resume", str(folder), "--total-steps", "192", "--no-live"]):
        # quiet: the whole test takes 3 s
        done = subprocess.run([sys.executable, "-c", limit, *args], capture_output=True, text=True, timeout=600,
                              cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
        assert done.returncode == 2, done.stderr[-2000:]
        line = _one_line(done.stderr)
        assert "model.safetensors: tensor 'network." in line, line


def test_the_policy_memory_budget(run, capsys):
    from packrl.checkpoint import WEIGHTS
    from packrl.config import defaults
    from packrl.train.run import check_architecture, make_vecenv

    meta = read_metadata(run / "checkpoint")
    vecenv = make_vecenv({**defaults(), "env": meta["config"]["env"], "vec": {**meta["config"]["vec"], "num_envs": 1}})
    try:
        check_architecture(vecenv, meta["config"]["policy"], run / "checkpoint" / WEIGHTS)
        with pytest.raises(CheckpointError, match="more than the budget"):
            check_architecture(vecenv, meta["config"]["policy"], run / "checkpoint" / WEIGHTS, max_bytes=100)
    finally:
        vecenv.close()
    assert main(["eval", str(run), "--episodes", "1", "--max-policy-gib", "1e-7"]) == 2
    assert "more than the budget" in _one_line(capsys.readouterr().err)
    assert main(["train", "--resume", str(run), "--total-steps", "192", "--no-live", "--max-policy-gib", "1e-7"]) == 2
    assert "more than the budget" in _one_line(capsys.readouterr().err)


# ---------------------------------------------------------------- inspect


def test_inspect_escapes_control_characters_in_every_field(run, tmp_path, capsys):
    folder = _copy(run, tmp_path)
    evil = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\r\x9b1m\u202e"
    _resign(folder / "checkpoint", lambda m: m.update({"env_id": None, "created": evil, evil: evil,
                                                       "layouts": {evil: {"nbytes": evil, "leaves": [
                                                           {"path": [{"str": evil}], "field": evil}]}}}))
    for args in ([], ["--full"], ["--json"]):
        assert main(["inspect", str(folder / "checkpoint"), *args]) == 0
        out = capsys.readouterr()
        text = out.out + out.err
        assert not any(c in text for c in "\x1b\x07\r\x9b\u202e"), repr(text[:400])
        assert "\\x1b" in text or "\\u001b" in text


def test_inspect_shows_rng_state_as_a_digest_unless_full(run, capsys):
    assert main(["inspect", str(run / "checkpoint"), "--json"]) == 0
    rng = json.loads(capsys.readouterr().out)["metadata"]["resume"]["rng"]
    assert all(isinstance(v, str) and v.startswith("sha256:") for v in rng.values())
    assert main(["inspect", str(run / "checkpoint")]) == 0
    short = capsys.readouterr().out
    assert main(["inspect", str(run / "checkpoint"), "--full"]) == 0
    full = capsys.readouterr().out
    assert "sha256:" in short and len(short) * 2 < len(full) and "sha256:" not in full.split("resume")[1][:200]


def test_inspect_of_a_16_mb_field_is_quick(run, tmp_path, capsys):
    """Quiet time on the 2-core project machine: 0.3 s (a 16 MB field took 42-130 s before it was cut)."""
    folder = _copy(run, tmp_path)
    _resign(folder / "checkpoint", lambda m: m.update(notes="x\x1b" * (8 << 20)))
    start = time.perf_counter()
    assert main(["inspect", str(folder / "checkpoint")]) == 0
    assert time.perf_counter() - start < 20.0
    out = capsys.readouterr().out
    assert "characters; --full prints all" in out and len(out) < 100_000


def test_inspect_full_prints_a_long_field_whole_outside_the_table(run, tmp_path, capsys):
    """Quiet time on the project machine: 2.8 s for this 2 MB field (20 s when rich folded it into a cell)."""
    folder = _copy(run, tmp_path)
    _resign(folder / "checkpoint", lambda m: m.update(notes="x\x1b" * (1 << 20)))
    start = time.perf_counter()
    assert main(["inspect", str(folder / "checkpoint"), "--full"]) == 0
    assert time.perf_counter() - start < 30.0
    out = capsys.readouterr().out
    assert "printed in full below the table" in out and "notes:\n" + "x\\x1b" * (1 << 20) + "\n" in out
    assert "\x1b" not in out


# ---------------------------------------------------------------- eval of a run folder


def test_eval_of_a_run_falls_back_to_the_newest_loadable_checkpoint(run, tmp_path, capsys):
    folder = _copy(run, tmp_path)
    (folder / "checkpoints" / "step-000000000999").mkdir()
    import shutil

    for name in ("metadata.json", "model.safetensors"):
        shutil.copy(folder / "checkpoint" / name, folder / "checkpoints" / "step-000000000999" / name)
    _resign(folder / "checkpoints" / "step-000000000999", lambda m: m.update(global_step=999))
    with open(folder / "checkpoints" / "step-000000000999" / "model.safetensors", "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\0\1\2\3")  # corrupt weights: the manifest still checks, the weights' hash does not
    checkpoint, _, skipped, verified = newest_checkpoint(folder)
    assert verified is not None and verified.folder == checkpoint
    assert checkpoint == folder / "checkpoint"
    assert len(skipped) == 1 and skipped[0].startswith("checkpoints/step-000000000999 (")
    assert main(["eval", str(folder), "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "skipped checkpoints/step-000000000999" in out and f"checkpoint: {folder / 'checkpoint'}" in out


# ---------------------------------------------------------------- errors during training


class NanRewardAfter(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, after: int = 40, interrupt_at: int | None = None):
        self.after, self.interrupt_at, self.t = after, interrupt_at, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.interrupt_at is not None and self.t == self.interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C twice in quick succession
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)
        reward = float("nan") if self.t > self.after else 1.0
        return np.zeros(2, np.float32), reward, False, self.t % 8 == 0, {}


def nan_reward_env(**kwargs):
    return NanRewardAfter(**kwargs)


def test_a_nan_reward_stops_training_with_one_named_line(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "tests.test_run_folder_safety:nan_reward_env", "--num-envs", "1", "--total-steps", "256",
                 "--train.num_steps", "16", "--no-live", "--out", str(out)])
    text = capsys.readouterr().err  # a stop is on stderr
    assert code == 3
    assert "Traceback" not in text
    stopped = [line for line in text.splitlines() if line.startswith("packrl train: training stopped")]
    # the env's 41st step is rollout step 8 of iteration 3 (16 steps per iteration)
    assert len(stopped) == 1 and "iteration 3, rollout step 8" in stopped[0] and "reward=nan" in stopped[0], text
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert "Traceback" in history[-1]["error"]  # the env's traceback is kept in the history


def test_a_second_ctrl_c_names_the_last_checkpoint_and_the_resume_command(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "tests.test_run_folder_safety:nan_reward_env", "--num-envs", "1", "--total-steps", "256",
                 "--train.num_steps", "16", "--no-live", "--out", str(out), "--checkpoint-every", "32",
                 "--env.kwargs", "{after = 100000, interrupt_at = 56}"])
    text = capsys.readouterr().err  # a stop is on stderr
    assert code == 130
    # step 56 is in iteration 4; the checkpoint of step 32 is the last one
    assert "second Ctrl-C" in text and f"the last checkpoint is {out / 'checkpoint'} (step 32)" in text, text
    assert f"continue with: packrl train tests.test_run_folder_safety:nan_reward_env --resume {out}" in text, text
    assert read_metadata(out / "checkpoint")["global_step"] == 32


@pytest.mark.parametrize("command", ["eval", "inspect", "train"])
def test_error_lines_escape_control_characters(tmp_path, capsys, command):
    where = str(tmp_path / "no\x1b[2Jsuch\nrun")
    argv = {"eval": ["eval", where], "inspect": ["inspect", where],
            "train": ["train", "--resume", where, "--no-live"]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2J" in err
    _one_line(err)
