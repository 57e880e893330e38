"""``--track`` with the real wandb: it writes nothing outside the run folder (its cache, config, data and
artifact folders and wandb-core's debug logs included), its start-up is bounded against a loopback host that
accepts connections and never answers, a bad WANDB_MODE is one line, and the printed ``wandb sync`` command
is shell-quoted."""
import shlex
import socket
import subprocess
import sys
import time

import pytest

from packrl.train.tracking import PROBE_SECONDS, wandb_mode
from tests.blocked_imports import ROOT, environment

pytest.importorskip("wandb")  # installed by the project's test extras; without it test_tracking checks the one line

TRAIN = ["train", "cartpole", "--total-steps", "256", "--train.num_steps", "64", "--num-envs", "2", "--hidden", "8",
         "--no-live", "--track", "--wandb-project", "packrl-tests"]


# quiet: this file's tests take at most 20 s
def packrl(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "packrl", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


def _env(tmp_path, **extra):
    env = environment(tmp_path / "home", set(), TMPDIR=str(tmp_path / "tmp"), **extra)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {k: v for k, v in env.items() if not k.startswith("XDG_")}  # ~/.cache is HOME/.cache


@pytest.fixture
def silent_host():
    """A loopback TCP server that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_track_writes_nothing_outside_the_run_folder_and_quotes_the_sync_command(tmp_path):
    env = _env(tmp_path)
    run = tmp_path / "my run $(touch pwned)"
    done = packrl([*TRAIN, "--out", str(run)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    (offline,) = (run / "wandb").glob("offline-run-*")
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("tracking:")]
    command = line.partition("upload it with: ")[2]
    assert shlex.split(command) == ["wandb", "sync", str(offline)], command
    logs = sorted(p.name for p in (run / "wandb").rglob("*-debug-*.log"))
    assert any(n.startswith("core-debug-") for n in logs), logs  # wandb-core's own log, now inside the run
    outside = [p for root in (tmp_path / "home", tmp_path / "tmp") for p in root.rglob("*") if "wandb" in str(p)]
    assert outside == [], outside
    assert not (ROOT / "pwned").exists() and not (tmp_path / "pwned").exists()


def test_a_host_that_accepts_and_never_answers_is_offline_within_the_probe_time(silent_host, tmp_path):
    start = time.monotonic()
    assert wandb_mode({"WANDB_API_KEY": "k" * 40, "WANDB_BASE_URL": silent_host, "HOME": str(tmp_path)}) == "offline"
    assert time.monotonic() - start < 10 * PROBE_SECONDS  # the probe waits PROBE_SECONDS (3 s), then gives up


def test_track_against_a_silent_host_trains_offline_with_one_tracking_line(silent_host, tmp_path):
    env = _env(tmp_path, WANDB_API_KEY="k" * 40, WANDB_BASE_URL=silent_host)
    run = tmp_path / "run"
    done = packrl([*TRAIN, "--out", str(run)], env, timeout=600)  # quiet: the whole test takes 17 s
    assert done.returncode == 0, done.stderr[-3000:]
    assert [ln for ln in done.stdout.splitlines() if ln.startswith("tracking:")][0].startswith(
        "tracking: W&B offline run")
    assert "Traceback" not in done.stderr


def test_online_against_a_silent_host_is_one_line_within_its_init_timeout(silent_host, tmp_path):
    """WANDB_MODE=online skips the probe: wandb.init meets the silent host and gives up after its init timeout
    (5 s here, set by WANDB_INIT_TIMEOUT; packrl's default is INIT_SECONDS, 30 s). Quiet, the command takes
    about 15 s in all (start-up, 5 s, exit); the issue saw 104 s and a traceback; the bound is 150 s."""
    env = _env(tmp_path, WANDB_API_KEY="k" * 40, WANDB_BASE_URL=silent_host, WANDB_MODE="online",
               WANDB_INIT_TIMEOUT="5")
    start = time.monotonic()
    done = packrl([*TRAIN, "--out", str(tmp_path / "run")], env, timeout=600)  # quiet: the whole test takes 20 s
    took = time.monotonic() - start
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("packrl train: --track: W&B did not start (online): "), lines
    assert took < 150, took


def test_a_bogus_wandb_mode_is_one_line_before_the_run_folder(tmp_path):
    done = packrl([*TRAIN, "--out", str(tmp_path / "run")], _env(tmp_path, WANDB_MODE="bogus"))
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == ("packrl train: --track: WANDB_MODE='bogus' is not a W&B mode; use one of online, offline, "
                           "disabled, shared, dryrun, run\n"), done.stderr
    assert not (tmp_path / "run").exists()
