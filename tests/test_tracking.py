"""``packrl train --track``: the per-iteration figures TensorBoard gets go to a Weights & Biases run under
RUN/wandb, offline when there are no credentials (this machine reaches no W&B host). The offline run file is
read back record by record (LevelDB log framing, wandb's own protobuf Record) and compared with
history.jsonl. Without wandb, ``--track`` is one line and exit status 2."""
import json
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from packrl.train.dashboard import LOGGED, PER_AGENT, VERSUS
from packrl.train.tracking import Tracking, TrackingError, wandb_mode
from tests.blocked_imports import ROOT, environment

BLOCK = 32768  # LevelDB log blocks; a W&B run file is one such log after a 7-byte ":W&B" header


def wandb_records(path: Path) -> list:
    """Every Record in a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):  # FULL, FIRST
            pending = chunk
        elif kind in (3, 4):  # MIDDLE, LAST
            pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


# quiet: this file's tests take at most 4 s
def packrl(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "packrl", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


def test_track_logs_every_iteration_to_an_offline_wandb_run(tmp_path):
    pytest.importorskip("wandb")
    env = environment(tmp_path / "home", set())  # no WANDB_* variables, no ~/.netrc: offline
    run = tmp_path / "run"
    done = packrl(["train", "cartpole", "--total-steps", "2048", "--track", "--wandb-project", "packrl-tests",
                   "--out", str(run), "--no-live"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("tracking:")]
    (offline,) = (run / "wandb").glob("offline-run-*")
    assert line == f"tracking: W&B offline run {offline}; upload it with: wandb sync {offline}"
    (run_file,) = offline.glob("run-*.wandb")
    records = wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in records]
    (started,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert started.project == "packrl-tests" and started.display_name == "run"
    config = {u.key: json.loads(u.value_json) for u in started.config.update}
    assert config["train"]["total_steps"] == 2048 and config["env"]["id"] == "cartpole"
    logged = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            logged[row["_step"]] = row
    history = [json.loads(ln) for ln in (run / "history.jsonl").read_text().splitlines()]
    assert sorted(logged) == [h["global_step"] for h in history]  # one W&B step per iteration, at its agent step
    compared = 0
    for h in history:
        expected = {f"train/{k}": v for k, v in h.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                    and (k in LOGGED or k.startswith((PER_AGENT, VERSUS)))}
        got = {k: v for k, v in logged[h["global_step"]].items() if not k.startswith("_")}
        assert got == expected, (h["global_step"], got, expected)
        compared += len(expected)
    assert compared >= 5 * len(history) and any("train/episode_return" in v for v in logged.values())
    assert kinds[-1] == "exit" and records[-1].exit.exit_code == 0


def test_track_without_wandb_is_one_line_naming_the_extra(tmp_path):
    env = environment(tmp_path / "home", {"wandb"})
    done = packrl(["train", "cartpole", "--total-steps", "64", "--track", "--out", str(tmp_path / "run")], env)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == ("packrl train: --track logs to Weights & Biases, which is not installed: "
                           "pip install 'packrl[wandb]'\n")
    assert not (tmp_path / "run").exists()  # refused before the run folder is made


@pytest.mark.parametrize("args, says", [
    (["--wandb-project", "p"], "--wandb-project applies with --track"),
    (["--wandb-entity", "me"], "--wandb-entity applies with --track"),
    (["--track", "--wandb-project", "a/b"], "--wandb-project 'a/b'"),
    (["--track", "--wandb-entity", " "], "--wandb-entity ' '"),
])
def test_wandb_flags_that_cannot_work_are_one_line_exit_2(tmp_path, args, says):
    env = environment(tmp_path / "home", set())
    done = packrl(["train", "cartpole", "--total-steps", "64", *args, "--out", str(tmp_path / "run")], env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_tracking_names_are_checked():
    assert Tracking("my-project", "team_1") == Tracking(project="my-project", entity="team_1")
    with pytest.raises(TrackingError, match="--wandb-project"):
        Tracking("x?y")


class Listener:
    """A TCP server on the loopback address that answers every request with an HTTP status line, and counts
    the connections it was offered."""

    def __init__(self):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.count = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.count += 1
            with conn:
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")

    def getsockname(self):
        return self.server.getsockname()

    def close(self):
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which holds the socket open
        except OSError:
            pass
        self.server.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def accepted(server) -> int:
    """The connections offered since the last call."""
    count, server.count = server.count, 0
    return count


def test_the_mode_is_the_users_else_offline_without_credentials_and_no_probe(listener, tmp_path):
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    home = str(tmp_path)  # no .netrc there
    assert wandb_mode({"WANDB_MODE": "disabled", "WANDB_API_KEY": "k", "WANDB_BASE_URL": url, "HOME": home}) == "disabled"
    assert wandb_mode({"WANDB_BASE_URL": url, "HOME": home}) == "offline"
    assert accepted(listener) == 0  # without credentials nothing is sent, not even a connection
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_BASE_URL": url, "HOME": home}) == "online"
    assert accepted(listener) == 1  # with them, one request decides
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login user password k\n")
    assert wandb_mode({"WANDB_BASE_URL": url, "HOME": home}) == "online"  # `wandb login` credentials count too
    port = listener.getsockname()[1]
    listener.close()  # nothing listens now: the host does not answer
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_BASE_URL": f"http://127.0.0.1:{port}", "HOME": home}) == "offline"
