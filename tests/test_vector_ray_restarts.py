"""Ray env workers that survive a lost actor, on a real local Ray cluster: an actor taken by ``ray.kill`` or
SIGKILL mid-run is replaced, its envs reset (seeded as documented), the cut episodes reported as truncated with
the last observation seen, and the other workers' rows are untouched (each compared byte for byte with serial);
a lost reset is redone; past ``max_restarts`` one error names the worker and its envs; a ``packrl train`` run
whose actor is killed finishes with the restarts in its history; MiniGrid ids resolve in actors; and
``--vec.address`` is checked."""
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import ray
import ray.cloudpickle
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from packrl import EnvError, UsageError, vector
from packrl.cli import main
from packrl.vector.ray_backend import RESTART_SEED_STRIDE, RayVectorEnv
from tests.processes import alive

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_runtime):
    """The session's Ray runtime (tests/conftest.py: retried on a slow start, a failure under CI)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors may not have tests/ on sys.path
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def cartpole():
    return gymnasium.make("CartPole-v1")


def minigrid_by_plain_id():
    """A creator that names a MiniGrid id without importing minigrid (an actor never imported it either)."""
    return gymnasium.make("MiniGrid-Empty-5x5-v0")



def wait_gone(pids):
    deadline = time.monotonic() + 60  # fault detection only (quiet: its callers take at most 5 s in all)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "actor processes survived"


def lose(venv, w, how="ray.kill"):
    """Kill worker ``w``'s actor (``ray.kill`` of the vector env's own handle, or SIGKILL to its process) and wait
    until its process is gone: ``ray.kill`` returns before the actor stops, so a step sent at once may still run."""
    pid = venv.worker_pids[w]
    if how == "ray.kill":
        ray.kill(venv.actors[w])
    else:
        os.kill(pid, signal.SIGKILL)  # the actor's process crashes
    wait_gone([pid])


class Reference:
    """A serial vector env of the same envs: what the rows of a block must read from a given reset on."""

    def __init__(self, num_envs, seed):
        self.env = vector.make(cartpole, num_envs)
        self.env.reset(seed=seed)

    def step(self, actions):
        out = self.env.step(actions)
        return [np.array(x) for x in out[:4]] + [np.array(self.env.final_observations)]


def test_killed_actors_are_replaced_and_their_cut_episodes_truncated():
    n, seed = 4, 3
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, n) for _ in range(40)]
    venv = vector.make(cartpole, n, backend="ray", num_workers=2, seed=seed)
    first_pids = list(venv.worker_pids)
    venv.reset()
    # Rows 0-1 come from worker 0, rows 2-3 from worker 1; each block follows the reference of its last reset.
    refs = {0: Reference(n, seed), 1: Reference(n, seed)}
    blocks = {0: slice(0, 2), 1: slice(2, 4)}
    kills = {5: (1, "ray.kill"), 17: (0, "SIGKILL"), 29: (1, "SIGKILL")}
    for t, a in enumerate(actions):
        lost = kills.get(t)
        last_obs = np.array(venv.observations)
        if lost is not None:
            lose(venv, *lost)
        obs, rew, term, trunc, infos = venv.step(a)
        expected = {w: ref.step(a) for w, ref in refs.items()}
        for w, rows in blocks.items():
            if lost is not None and lost[0] == w:
                restarts = venv.restarts
                assert trunc[rows].all() and not term[rows].any() and not rew[rows].any(), (t, w)
                np.testing.assert_array_equal(venv.final_observations[rows], last_obs[rows])
                assert all(infos[e]["actor_restarted"] == venv.worker_restarts[w] for e in range(2 * w, 2 * w + 2))
                # The new actor's envs: reset with seed + restarts * 2**32, env i its usual offset.
                refs[w] = Reference(n, seed + restarts * RESTART_SEED_STRIDE)
                np.testing.assert_array_equal(obs[rows], refs[w].env.observations[rows])
                continue
            o, r, te, tr, final = expected[w]
            for name, got, want in (("obs", obs, o), ("rew", rew, r), ("term", term, te), ("trunc", trunc, tr)):
                assert got[rows].tobytes() == want[rows].tobytes(), f"{name} of worker {w} at step {t}"
            ended = te[rows] | tr[rows]
            np.testing.assert_array_equal(venv.final_observations[rows][ended], final[rows][ended])
    assert venv.restarts == 3 and venv.worker_restarts == [1, 2]
    assert set(venv.worker_pids).isdisjoint(first_pids)
    pids = list(venv.worker_pids)
    venv.close()
    wait_gone(first_pids + pids)


def test_a_reset_whose_actor_was_lost_is_redone_with_its_seed():
    venv = vector.make(cartpole, 4, backend="ray", num_workers=2, seed=0)
    venv.reset()
    lose(venv, 0)
    obs, _ = venv.reset(seed=11)
    assert venv.restarts == 1
    np.testing.assert_array_equal(obs, Reference(4, 11).env.observations)
    _, _, term, trunc, _ = venv.step(np.zeros(4, np.int64))
    assert not trunc.any() and not term.any()  # a reset cuts no episode
    venv.close()


def test_past_max_restarts_one_error_names_the_worker_and_its_envs():
    venv = vector.make(cartpole, 4, backend="ray", num_workers=2, max_restarts=1)
    venv.reset(seed=0)
    lose(venv, 1)
    venv.step(np.zeros(4, np.int64))
    assert venv.worker_restarts == [0, 1]
    lose(venv, 1, "SIGKILL")
    with pytest.raises(EnvError, match=r"ray worker 1 \(envs 2..3\) was lost again \(\w+\) after 1 restart\(s\); "
                                       r"max_restarts=1") as err:
        venv.step(np.zeros(4, np.int64))
    assert err.value.worker == 1
    with pytest.raises(EnvError, match="failed earlier"):
        venv.step(np.zeros(4, np.int64))
    venv.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_max_restarts_must_be_a_count(bad):
    with pytest.raises(UsageError, match=f"max_restarts must be an int >= 0.*got {bad!r}"):
        RayVectorEnv(cartpole, 2, max_restarts=bad)


def test_address_is_refused_when_ray_is_already_running():
    with pytest.raises(UsageError, match="address='auto': Ray is already initialized in this process"):
        vector.make(cartpole, 2, backend="ray", address="auto")
    with pytest.raises(UsageError, match="address must be auto, local, host:port"):
        vector.make(cartpole, 2, backend="ray", address="10.0.0.1")


def test_minigrid_ids_resolve_in_ray_actors():
    import minigrid  # noqa: F401 - the driver's registry, as a user's script has it

    serial = vector.make(minigrid_by_plain_id, 2, seed=5)
    want, _ = serial.reset()
    with vector.make(minigrid_by_plain_id, 2, backend="ray", num_workers=2, seed=5) as venv:
        obs, _ = venv.reset()
        assert obs.tobytes() == want.tobytes()
        a = np.array([2, 1])
        assert venv.step(a)[0].tobytes() == serial.step(a)[0].tobytes()


def test_minigrid_ids_resolve_in_actors_of_a_driver_that_never_imported_minigrid():
    # A fresh driver joins this cluster: neither it nor its actors ran `import minigrid`.
    script = (
        "import sys, gymnasium, numpy as np\n"
        "from packrl import vector\n"
        "assert 'minigrid' not in sys.modules\n"
        "v = vector.make(lambda: gymnasium.make('MiniGrid-Empty-5x5-v0'), 2, backend='ray', num_workers=1, seed=5)\n"
        "obs, _ = v.reset()\n"
        "print(obs.tobytes().hex())\n"
        "v.close()\n")
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    # quiet: the whole test takes 2 s
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    import minigrid  # noqa: F401

    want, _ = vector.make(minigrid_by_plain_id, 2, seed=5).reset()
    assert done.stdout.strip().splitlines()[-1] == want.tobytes().hex()


def ray_vector_envs():
    # type() rather than isinstance: no attribute lookups on every object of the heap
    return [o for o in gc.get_objects() if type(o) is RayVectorEnv and getattr(o, "_seeded", False) and not o.closed]


def test_packrl_train_on_ray_survives_killed_actors_and_records_restarts(tmp_path, capsys):
    kills = []
    stop = threading.Event()

    def killer():
        """Find the run's vector env, kill one of its actors by its handle, twice, a restart apart."""
        while not stop.is_set():
            found = ray_vector_envs()
            venv = found[0] if found else None
            if venv is not None and venv.restarts == len(kills) and len(kills) < 2:
                time.sleep(0.5)  # some steps between losses
                ray.kill(venv.actors[len(kills) % venv.num_workers])
                kills.append(time.monotonic())
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        rc = main(["train", "CartPole-v1", "--backend", "ray", "--num-envs", "4", "--num-workers", "2",
                   "--total-steps", "16384", "--train.num_steps", "64", "--out", str(tmp_path / "run")])
    finally:
        stop.set()
        thread.join(30)
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    history = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert kills, "the run ended before an actor could be killed"
    assert history[-1]["env_restarts"] == len(kills)
    assert history[-1]["global_step"] >= 16384
    counts = [row["env_restarts"] for row in history]
    assert counts == sorted(counts) and counts[0] <= len(kills)


def test_packrl_train_minigrid_on_ray(tmp_path, capsys):
    rc = main(["train", "MiniGrid-Empty-5x5-v0", "--backend", "ray", "--num-envs", "2", "--num-workers", "2",
               "--total-steps", "256", "--train.num_steps", "64", "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    history = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert history[-1]["env_restarts"] == 0 and history[-1]["global_step"] >= 256


@pytest.mark.parametrize("argv, words", [
    (["--vec.address", "10.0.0.1:6379"], "vec.address = '10.0.0.1:6379' is the Ray cluster of the ray backend, "
                                         "not backend 'serial'"),
    (["--backend", "multiprocessing", "--vec.address", "auto"], "not backend 'multiprocessing'"),
    (["--backend", "ray", "--vec.address", "10.0.0.1"], "--vec.address 10.0.0.1: expected auto, local, host:port"),
    (["--backend", "ray", "--vec.address", "h:70000"], "--vec.address h:70000: expected auto"),
])
def test_vec_address_flag_misuse_is_one_line_exit_2(argv, words, tmp_path):
    done = subprocess.run([sys.executable, "-m", "packrl", "train", "CartPole-v1", "--total-steps", "64", *argv,
                           # quiet: the whole test takes 2 s
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_vec_address_where_no_cluster_answers_is_one_line_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "packrl", "train", "CartPole-v1", "--backend", "ray",
                           "--vec.address", "127.0.0.1:1", "--total-steps", "64", "--out", str(tmp_path / "run")],
                          # quiet: the whole test takes 2 s
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 2, done.stderr
    # a refused connection is refused at once: no 'within 10 s' in its line
    assert "cannot join the Ray cluster at address='127.0.0.1:1': nothing answers at 127.0.0.1:1 (Connection " \
           "refused)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_vec_address_where_no_ray_answers_is_one_line_exit_2(tmp_path):
    """An HTTP server at the address: Ray's client would retry it for ever, printing C++ warnings (issue 42); packrl
    asks it HTTP/2's preface first and refuses it in one line, with nothing of Ray's printed."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60  # quiet: the whole test takes 2 s
        while time.monotonic() < deadline:
            try:
                # one try of a polling loop: the loop's deadline above bounds the wait
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        done = subprocess.run([sys.executable, "-m", "packrl", "train", "CartPole-v1", "--backend", "ray",
                               "--vec.address", f"127.0.0.1:{port}", "--total-steps", "64", "--out",
                               # quiet: the whole test takes 2 s
                               str(tmp_path / "run")], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                              env={**os.environ, "RAY_ADDRESS": ""})
    finally:
        server.kill()
        server.wait()
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [line for line in done.stderr.strip().splitlines()
                                                 if "is not a Ray cluster" in line], done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_multinode_doc_runs_on_one_machine(tmp_path):
    """docs/multinode.md's one-machine block as a bash script, with the changes the doc states: a free port for
    6379 (other Rays may run here), the head's own --temp-dir (`ray start` records its address in
    /tmp/ray/ray_current_cluster, where any plain ray.init() on the machine, other tests' included, would join it)
    and --block in its own process group, stopped by killing that group instead of `ray stop` (which stops every
    Ray of the user)."""
    import shutil
    import tempfile

    temp_dir = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # short: Ray's socket paths live under it
    text = (ROOT / "docs" / "multinode.md").read_text()
    block = text.split("## On one machine, as written")[1].split("```bash\n")[1].split("```")[0]
    lines = block.strip().splitlines()
    assert lines[-1] == "ray stop" and lines[1].startswith("ray start --head")
    port = str(free_port())
    lines = [line.replace("6379", port) for line in lines[:-1]]
    lines[1] = f"setsid {lines[1]} --temp-dir {temp_dir} --block > head.log 2>&1 & echo $! > head.pid; sleep 1"
    wait = f"for i in $(seq 240); do python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\" " \
           "2>/dev/null && break; sleep 0.5; done"
    script = "\n".join(["set -e", lines[0], lines[1], wait, *lines[2:]]) + "\n"
    bin_dir = Path(sys.executable).parent  # ray, packrl and python of this venv, as an activated venv has them
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)  # quiet: the whole test takes 20 s
    finally:
        pid_file = tmp_path / "head.pid"
        if pid_file.exists():
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(5)  # the head's processes leave their session folder
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    history = [json.loads(line) for line in (tmp_path / "runs" / "cartpole-ray" / "history.jsonl").read_text()
               .splitlines()]
    assert history[-1]["global_step"] >= 4096 and history[-1]["env_restarts"] == 0
    config = json.loads((tmp_path / "runs" / "cartpole-ray" / "checkpoint" / "metadata.json").read_text())
    assert f'"address": "127.0.0.1:{port}"' in json.dumps(config)


def test_async_batches_go_on_when_an_actor_is_lost():
    n, batch = 4, 2
    venv = vector.make(cartpole, n, backend="ray", num_workers=4, batch_size=batch, seed=2,
                       actor_options={"num_cpus": 0.5})  # 4 workers on 2 cores
    venv.async_reset()
    stepping = set()  # envs whose reply in flight is a step's (a lost reset is redone, not a cut episode)
    while 2 not in stepping:
        b = venv.recv()
        venv.send(np.zeros(batch, np.int64))
        stepping.update(int(e) for e in b.env_ids)
    lose(venv, 2)
    cut = []
    deadline = time.monotonic() + 120  # fault detection only (quiet: the whole test takes 4 s)
    while not cut and time.monotonic() < deadline:
        b = venv.recv()
        for row, e in enumerate(b.env_ids):
            if "actor_restarted" in b.infos[row]:
                cut.append(int(e))
                assert b.truncations[row] and not b.terminals[row] and b.rewards[row] == 0
        venv.send(np.zeros(batch, np.int64))
    assert cut == [2] and venv.worker_restarts == [0, 0, 1, 0]
    for _ in range(8):  # and every env keeps coming
        b = venv.recv()
        venv.send(np.zeros(batch, np.int64))
    venv.close()


def test_the_dashboard_shows_the_restarts():
    import io

    from rich.console import Console

    from packrl.train.dashboard import Dashboard

    console = Console(file=io.StringIO(), width=120)
    board = Dashboard("t", 100, live=False, console=console)
    board.update({"global_step": 10, "sps": 5.0})
    assert "ray actor restarts" not in _table_rows(board, console)  # other backends: no row
    board.update({"global_step": 20, "sps": 5.0, "env_restarts": 2})
    assert re.search(r"ray actor restarts\W+2\b", _table_rows(board, console))


def _table_rows(board, console):
    with console.capture() as capture:
        console.print(board.table())
    return capture.get()


@hsettings(max_examples=300)
@given(st.one_of(st.text(max_size=30), st.builds(lambda h, p: f"{h}:{p}", st.text(max_size=12),
                                                  st.integers(-5, 70_000))))
def test_the_setting_and_the_backend_check_addresses_alike(text):
    from packrl.config import _check_ray_address
    from packrl.vector.ray_backend import check_address

    try:
        check_address(text)
        backend_ok = True
    except UsageError:
        backend_ok = False
    assert (_check_ray_address(text) is None) == backend_ok, text


def test_a_lost_multi_agent_actor_truncates_its_agent_rows():
    import functools

    from mpe2 import simple_spread_v3

    creator = functools.partial(simple_spread_v3.parallel_env, N=2, max_cycles=50)
    venv = vector.make(creator, 2, backend="ray", num_workers=2, seed=0)
    venv.reset()
    actions = np.zeros(venv.num_agents, np.int64)
    venv.step(actions)
    alive_before = np.array(venv.masks)
    last = np.array(venv.observations)
    lose(venv, 1)
    _, rew, term, trunc, infos = venv.step(actions)
    rows = slice(2, 4)  # env 1's two agent rows
    assert alive_before[rows].all()
    np.testing.assert_array_equal(trunc[rows], alive_before[rows])
    assert not term[rows].any() and not rew[rows].any() and infos[1]["actor_restarted"] == 1
    np.testing.assert_array_equal(venv.final_observations[rows], last[rows])
    assert not trunc[:2].any() and "actor_restarted" not in infos[0]
    venv.close()
