"""``packrl train`` under ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU) is one data-parallel run:
one run folder, ``world_size`` 2 in every checkpoint, every rank's weights bit-identical at every checkpoint
(proved in the run, and checked here against the weights file), the same seed giving the same weights, resume
of every rank, a SIGTERM to one rank saving once and stopping all, a rank killed making the other exit non-zero
naming it. Real torchrun, real processes, the Numba CartPole."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from packrl.checkpoint import load_checkpoint, read_metadata
from packrl.train.distributed import state_digest

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ENVS, STEPS = 4, 64  # per rank: one iteration is 2 x 4 x 64 = 512 agent steps
SMALL = ["--no-live", "--vec.num_envs", str(ENVS), "--train.num_steps", str(STEPS), "--checkpoint-minutes", "0"]
START_TIMEOUT = 300  # two Python processes importing torch and compiling Numba on a busy 2-core machine


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _torchrun(cwd: Path, *args: str, new: bool = True) -> subprocess.Popen:
    """``packrl train`` under torchrun with 2 ranks: a new small CartPole run, or (``new=False``) a resumed one,
    which takes its settings from its checkpoint."""
    command = ["cartpole", *SMALL] if new else ["--no-live", "--checkpoint-minutes", "0"]
    return subprocess.Popen([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "packrl", "train",
                             *command, *args], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _run(cwd: Path, *args: str, new: bool = True) -> tuple[int, str]:
    proc = _torchrun(cwd, *args, new=new)
    out, _ = proc.communicate(timeout=START_TIMEOUT + 300)
    return proc.returncode, out


def _policy_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    state, _, _ = load_checkpoint(checkpoint)
    return state


def _checkpoints(folder: Path) -> list[Path]:
    return [folder / "checkpoint", *sorted((folder / "checkpoints").glob("step-*"))]


def _assert_ranks_identical(checkpoint: Path) -> dict:
    """The checkpoint records both ranks' digests, equal, and equal to the digest of the weights it holds."""
    meta = read_metadata(checkpoint)
    dist_meta = meta["distributed"]
    assert dist_meta["world_size"] == 2, dist_meta
    digests = dist_meta["weights_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1], (checkpoint, digests)
    assert state_digest(_policy_state(checkpoint)) == digests[0], checkpoint
    return meta


def _history(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    cwd = tmp_path_factory.mktemp("torchrun")
    code, out = _run(cwd, "--total-steps", "4096", "--train.seed", "3", "--checkpoint-every", "1024")
    assert code == 0, out[-4000:]
    return cwd, out


def test_two_ranks_are_one_run(two_rank_run):
    cwd, out = two_rank_run
    folders = [p for p in (cwd / "runs").iterdir()]
    assert len(folders) == 1, folders  # not one folder per rank
    folder = folders[0]
    assert out.count("run folder: ") == 1, out  # rank 1 prints nothing
    assert "x 2 ranks" in out, out
    saved = _checkpoints(folder)
    assert len(saved) == 4, saved  # checkpoint/ and step-1024, -2048, -3072
    for checkpoint in saved:
        meta = _assert_ranks_identical(checkpoint)
        assert meta["distributed"]["rank_seeds"] == [3, 4], meta["distributed"]
        assert meta["distributed"]["backend"] == "gloo"
    final = read_metadata(folder / "checkpoint")
    assert final["global_step"] >= 4096 and final["iteration"] == 8, final["global_step"]
    # each rank continues from its own training state: the ranks draw from different generators
    rank1 = final["distributed"]["resume_by_rank"][1]
    assert rank1["rng"]["torch"] != final["resume"]["rng"]["torch"]
    assert rank1["global_step"] == final["resume"]["global_step"]
    # global_step counts both ranks' agent steps, every iteration
    rows = _history(folder)
    assert [r["global_step"] for r in rows] == [512 * i for i in range(1, 9)], rows
    assert all(r["agent_steps"] == 2 * ENVS * STEPS for r in rows)


def test_same_seed_same_checkpoint(two_rank_run, tmp_path):
    cwd, _ = two_rank_run
    first = next((cwd / "runs").iterdir())
    code, out = _run(tmp_path, "--total-steps", "4096", "--train.seed", "3", "--checkpoint-every", "1024",
                     "--out", "again")
    assert code == 0, out[-4000:]
    for a, b in zip(_checkpoints(first), _checkpoints(tmp_path / "again"), strict=True):
        assert a.name == b.name
        left, right = _policy_state(a), _policy_state(b)
        assert left.keys() == right.keys()
        for name in left:
            assert left[name].numpy().tobytes() == right[name].numpy().tobytes(), (a, name)


def test_resume_restores_every_rank(two_rank_run, tmp_path):
    """Resumed twice from the same checkpoint under torchrun: both continue to the new total with world_size 2
    and identical ranks, and give the same weights (each rank's recorded RNG state and env seeds)."""
    cwd, _ = two_rank_run
    first = next((cwd / "runs").iterdir())
    start = first / "checkpoints" / "step-000000002048"
    finals = []
    for name in ("resumed-a", "resumed-b"):
        code, out = _run(tmp_path, "--resume", str(start), "--total-steps", "3072", "--out", name, new=False)
        assert code == 0, out[-4000:]
        assert out.count("resuming ") == 1, out
        meta = _assert_ranks_identical(tmp_path / name / "checkpoint")
        assert meta["global_step"] == 3072 and meta["iteration"] == 6, meta["global_step"]
        assert [r["iteration"] for r in _history(tmp_path / name)] == [5, 6]
        finals.append(_policy_state(tmp_path / name / "checkpoint"))
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    # the resumed ranks trained on: their weights moved from the checkpoint's
    assert not all(torch.equal(finals[0][k], v) for k, v in _policy_state(start).items())


def test_resume_with_another_world_size_is_refused(two_rank_run):
    cwd, _ = two_rank_run
    folder = next((cwd / "runs").iterdir())
    done = subprocess.run([sys.executable, "-m", "packrl", "train", "--resume", str(folder), "--no-live"],
                          # quiet: the whole test takes 2 s
                          cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "world_size 2" in lines[0] and "torchrun --nproc-per-node 2" in lines[0], done.stderr


def _rank_pid(parent: int, rank: int, timeout: float = START_TIMEOUT) -> int:
    """The pid of torchrun's worker of ``rank`` (a child of ``parent`` whose environment says RANK=rank)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                environ = (entry / "environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent and f"RANK={rank}".encode() in environ:
                return int(entry.name)
        time.sleep(0.2)
    raise AssertionError(f"no worker of rank {rank} under pid {parent}")


def _wait_for_training(folder: Path, iterations: int = 2, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    history = folder / "history.jsonl"
    while time.monotonic() < deadline:
        if history.exists() and len(history.read_text().splitlines()) >= iterations:
            return
        time.sleep(0.2)
    raise AssertionError(f"{history}: training did not get under way")


def test_sigterm_to_one_rank_saves_once_and_stops_all(tmp_path):
    proc = _torchrun(tmp_path, "--total-steps", "100000000", "--out", "run")
    try:
        _wait_for_training(tmp_path / "run")
        os.kill(_rank_pid(proc.pid, 1), signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)  # quiet: the whole test takes 5 s
    finally:
        proc.kill()
    stopped = re.findall(r"interrupted by SIGTERM on rank 1 at ([\d,]+) steps; checkpoint saved", out)
    assert len(stopped) == 1, out[-4000:]
    meta = _assert_ranks_identical(tmp_path / "run" / "checkpoint")
    rows = _history(tmp_path / "run")
    assert meta["global_step"] == rows[-1]["global_step"] == int(stopped[0].replace(",", ""))
    assert meta["global_step"] < 100000000
    assert not (tmp_path / "run" / "checkpoints").exists()  # one save: the last one, no periodic one
    # both ranks left with 143 and neither was cut short by torchrun
    assert "exitcode  : 143" in out and "exitcode  : -" not in out, out[-3000:]


def test_killed_rank_makes_the_other_exit_naming_it(tmp_path):
    """SIGKILL to rank 1: rank 0 stops within 60 s, non-zero, naming rank 1; nothing half-updated is saved."""
    proc = _torchrun(tmp_path, "--total-steps", "100000000", "--out", "run")
    try:
        _wait_for_training(tmp_path / "run")
        os.kill(_rank_pid(proc.pid, 1), signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=120)  # quiet: the whole test takes 4 s
        elapsed = time.monotonic() - killed
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert elapsed < 60, elapsed
    assert re.search(r"training stopped: .*rank 0: lost rank 1 \(pid \d+ on this host has exited\)", out), out[-4000:]
    assert not (tmp_path / "run" / "checkpoint").exists()


def _free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on now (the rendezvous store of ranks started by hand)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_by_hand(cwd: Path, port: int) -> list[subprocess.Popen]:
    """Two ranks started with torchrun's variables but no torchrun: nothing but packrl stops the survivor."""
    procs = []
    for rank in range(2):
        env = {**_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "packrl", "train", "cartpole", *SMALL, "--total-steps",
                                       "100000000", "--out", "run", "--collective-timeout", "30"],
                                      cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


@pytest.mark.parametrize("victim", [1, 0])
def test_lost_rank_without_torchrun_never_hangs(tmp_path, victim):
    """Without torchrun's agent (which SIGTERMs the others), the survivor alone finds the lost rank, whichever it
    is (rank 0 also hosts the rendezvous store): exit 3 within 60 s, one line naming it."""
    procs = _launch_by_hand(tmp_path, _free_port())
    try:
        _wait_for_training(tmp_path / "run")
        procs[victim].kill()
        killed = time.monotonic()
        survivor = procs[1 - victim]
        out, _ = survivor.communicate(timeout=120)  # quiet: the whole test takes 4 s
        elapsed = time.monotonic() - killed
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert elapsed < 60, elapsed
    assert survivor.returncode == 3, out[-3000:]
    assert f"lost rank {victim} (pid {procs[victim].pid} on this host has exited)" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


CHECK_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from packrl.train import distributed
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = distributed.join(30.0)
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    assert group.broadcast_text("from rank 0" if rank == 0 else "ignored") == "from rank 0"
    assert group.gather_text("r" * (rank + 1)) == ["r", "rr"]
    group.check_identical(module, "same")
    if rank == 1:
        with torch.no_grad():
            module.bias[0] = torch.nextafter(module.bias[0], torch.tensor(1.0))  # one ulp
    try:
        group.check_identical(module, "one ulp apart")
    except distributed.DivergedError as err:
        print(err)
    dist.destroy_process_group()
""")


def test_check_identical_catches_one_ulp(tmp_path):
    """The in-run proof can fail: a one-ulp difference on rank 1 is refused on both ranks, naming rank 1."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", CHECK_SCRIPT, str(rank), str(port)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]  # quiet: the whole test takes 3 s
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.startswith("one ulp apart: the weights of rank 1 differ from rank 0's"), out


LATE_SIGNAL_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch.distributed as dist
    from packrl.train import distributed
    from packrl.train.session import StopSignals, _agree
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = distributed.join(30.0)
    sums = 0
    real_sum = group.sum

    def sum_then_signal(values):  # rank 1's SIGTERM lands after its vote has left, in the first agreement
        global sums
        summed = real_sum(values)
        sums += 1
        if rank == 1 and sums == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return summed

    group.sum = sum_then_signal
    stops = StopSignals()
    with stops:
        for agreement in range(1, 6):
            _agree(group, None, stops, False)
            if stops.received is not None:  # the training loop's test (``callback`` in session._train)
                break
        group.barrier()  # the next collective after the loop: both ranks must reach the same one
    print(f"stopped at agreement {agreement} by {stops.received} from ranks {group.stopping}")
    dist.destroy_process_group()
""")


def test_a_signal_after_its_ranks_vote_stops_every_rank_at_the_same_agreement(tmp_path):
    """A SIGTERM that reaches rank 1 after its vote in an agreement has left (the race behind a gloo abort,
    'op.preamble.length <= op.nbytes. 16 vs 8', instead of a saved stop) stops no rank at that agreement:
    both ranks go on and stop together at the next one, which carries the signal."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", LATE_SIGNAL_SCRIPT, str(rank), str(port)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]  # quiet: the whole test takes 3 s
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert out.strip() == f"stopped at agreement 2 by {int(signal.SIGTERM)} from ranks [1]", (out, err[-3000:])


def test_bad_collective_timeout_is_one_line():
    done = subprocess.run([sys.executable, "-m", "packrl", "train", "cartpole", "--collective-timeout", "0"],
                          # quiet: the whole test takes under 1 s
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--collective-timeout" in done.stderr


def test_the_docs_one_machine_commands_run_as_written(tmp_path):
    """docs/training.md's one-machine block: train, then resume, both exit 0 in one run folder."""
    text = (ROOT / "docs" / "training.md").read_text().split("## Data-parallel: torchrun", 1)[1]
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 2 and all(line.startswith("torchrun --standalone") for line in lines), lines
    for line in lines:
        done = subprocess.run(line, shell=True, cwd=tmp_path, env={**_env(), "PATH": f"{TORCHRUN.parent}:"
                              f"{os.environ['PATH']}"}, capture_output=True, text=True, timeout=START_TIMEOUT + 300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["cartpole-2ranks"]
    meta = _assert_ranks_identical(tmp_path / "runs" / "cartpole-2ranks" / "checkpoint")
    assert meta["global_step"] >= 12000


def test_a_rank_that_hangs_stops_the_other_after_the_timeout(tmp_path):
    """SIGSTOP to rank 1 (alive, silent): rank 0's next collective gives up after --collective-timeout (30 s here)
    and it exits 3 with one line saying no rank on this host exited and how long collectives wait."""
    procs = _launch_by_hand(tmp_path, _free_port())
    try:
        _wait_for_training(tmp_path / "run")
        procs[1].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        out, _ = procs[0].communicate(timeout=400)  # quiet: the whole test takes 35 s
        elapsed = time.monotonic() - stopped
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == 3, out[-3000:]
    assert 25 < elapsed < 300, elapsed  # the timeout, not at once and not never
    assert "rank 0: lost contact with the other ranks (none on this host has exited; a rank may hang: collectives " \
           "wait 30 s)" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


def test_a_folder_rank_zero_refuses_is_one_line_from_rank_zero(two_rank_run):
    cwd, _ = two_rank_run
    folder = next((cwd / "runs").iterdir())
    code, out = _run(cwd, "--total-steps", "512", "--out", str(folder))
    assert code != 0
    errors = [line for line in out.splitlines() if line.startswith("packrl train:")]
    assert len(errors) == 1 and "already exists" in errors[0], out[-3000:]
    assert read_metadata(folder / "checkpoint")["global_step"] == 4096  # the old run is untouched
