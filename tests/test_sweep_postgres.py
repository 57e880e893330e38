"""packrl sweep on a real PostgreSQL server (Debian's package: initdb in a temporary folder, a loopback port, as
the postgres user when the tests run as root, since postgres refuses root): two sweeps in two folders share one
study and finish N trials between them, no trial number twice, and the password is never printed or written."""
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg2
import pytest

from tests.benchmark_modules import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = load_benchmark("sweep_shared").PASSWORD
SPACE = load_benchmark("sweep_shared").SPACE


@pytest.fixture(scope="module")
def postgres():
    with load_benchmark("sweep_shared").postgres_server() as url:
        yield url


def _sweep(url, out, space, *extra):
    return subprocess.Popen([sys.executable, "-m", "packrl", "sweep", "cartpole", "--trials", "4", "--budget", "2048",
                             "--space", str(space), "--pruner", "none", "--storage", url, "--study", "shared",
                             "--out", str(out), "--no-live", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_two_sweeps_share_one_postgresql_study_and_never_show_its_password(postgres, tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    first, second = _sweep(postgres, tmp_path / "a", space), _sweep(postgres, tmp_path / "b", space, "--seed", "1")
    outputs = [p.communicate(timeout=400) for p in (first, second)]  # quiet: the whole test takes 14 s
    assert first.returncode == 0 and second.returncode == 0, outputs
    with psycopg2.connect(postgres) as db, db.cursor() as cursor:
        cursor.execute("select t.number, t.state from trials t join studies s on s.study_id = t.study_id "
                       "where s.study_name = 'shared' order by t.number")
        rows = cursor.fetchall()
    numbers = [n for n, _ in rows]
    assert len(numbers) == len(set(numbers)) and [s for _, s in rows].count("COMPLETE") == 4, rows
    ran = [{int(p.name) for p in (tmp_path / f / "trials").iterdir() if p.is_dir()} for f in ("a", "b")]
    assert ran[0] and ran[1] and not ran[0] & ran[1] and ran[0] | ran[1] == set(numbers)
    for text in [*(o for pair in outputs for o in pair)]:
        assert PASSWORD not in text
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    assert "***" in (tmp_path / "a" / "sweep.json").read_text()
    shown = subprocess.run([sys.executable, "-m", "packrl", "sweep", "show", str(tmp_path / "a"), "--storage", postgres,
                            # quiet: the whole test takes 14 s
                            "--no-plots"], capture_output=True, text=True, cwd=ROOT, timeout=150)
    assert shown.returncode == 0 and "best trials" in shown.stdout and PASSWORD not in shown.stdout + shown.stderr
    refused = subprocess.run([sys.executable, "-m", "packrl", "sweep", "show", str(tmp_path / "a")],
                             capture_output=True, text=True, cwd=ROOT, timeout=150)  # quiet: the whole test takes 14 s
    assert refused.returncode == 2 and "--storage" in refused.stderr and PASSWORD not in refused.stderr


def test_a_wrong_password_is_one_line_without_it(postgres, tmp_path):
    wrong = postgres.replace(PASSWORD, "not-the-Pw1")
    done = subprocess.run([sys.executable, "-m", "packrl", "sweep", "cartpole", "--budget", "4096", "--storage", wrong,
                           # quiet: the whole test takes under 1 s
                           "--out", str(tmp_path / "w")], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "does not answer" in done.stderr and "not-the-Pw1" not in done.stderr + done.stdout


def test_killing_one_of_two_sweeps_mid_trial_leaves_the_other_running_to_n(postgres, tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    study = ["--study", "shared-kill", "--budget", "4096"]
    killed, survivor = _sweep(postgres, tmp_path / "a", space, *study), _sweep(postgres, tmp_path / "b", space, "--seed",
                                                                               "1", *study)
    end = time.monotonic() + 300  # quiet: the whole test takes 28 s
    while not any(p.is_file() and p.read_text().count("\n") >= 2 for p in (tmp_path / "a").glob("trials/*/history.jsonl")):
        assert time.monotonic() < end and killed.poll() is None
        time.sleep(0.2)
    killed.kill()  # SIGKILL mid-trial: its trial is left RUNNING, then failed by the survivor once its heartbeat stops
    killed.communicate()
    stdout, stderr = survivor.communicate(timeout=600)  # quiet: the whole test takes 28 s
    assert survivor.returncode == 0, stderr
    with psycopg2.connect(postgres) as db, db.cursor() as cursor:
        cursor.execute("select t.number, t.state from trials t join studies s on s.study_id = t.study_id "
                       "where s.study_name = 'shared-kill' order by t.number")
        rows = cursor.fetchall()
    numbers = [n for n, _ in rows]
    assert len(numbers) == len(set(numbers)) and [s for _, s in rows].count("COMPLETE") == 4, rows
    cut = {int(p.name) for p in (tmp_path / "a" / "trials").iterdir() if p.is_dir()} - \
        {n for n, s in rows if s == "COMPLETE"}
    assert cut and all(dict(rows)[n] == "FAIL" for n in cut)  # the killed sweep's trial: failed, not counted


def _fresh_database(url: str, name: str) -> str:
    admin = psycopg2.connect(url)
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f"create database {name}")
    admin.close()
    return url.rsplit("/", 1)[0] + "/" + name


def test_a_new_database_whose_schema_two_sweeps_make_at_once_opens_for_both(postgres):
    """Two sweeps that start together on a new database both make its schema: the later one has checked that the
    type is missing when the other commits it, and its CREATE TYPE fails ('type "studydirection" already exists',
    the failure of a CI run). Held here by an event trigger that pauses this sweep's CREATE TYPE while the other
    (a connection the trigger skips) makes and commits the type; this sweep must then open the database."""
    from packrl.sweep.storage import open_storage

    db = _fresh_database(postgres, "made_at_once")
    with psycopg2.connect(db) as setup, setup.cursor() as cursor:
        cursor.execute("create function hold() returns event_trigger language plpgsql as $$ begin "
                       "if tg_tag = 'CREATE TYPE' then perform pg_sleep(3); end if; end $$")
        cursor.execute("create event trigger hold_create_type on ddl_command_start execute function hold()")
    outcome: dict = {}

    def open_it():
        try:
            outcome["storage"] = open_storage(db)
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = err

    opener = threading.Thread(target=open_it)
    opener.start()
    watch = psycopg2.connect(db)
    watch.autocommit = True  # pg_stat_activity is read once per transaction: each query its own
    deadline = time.monotonic() + 120  # quiet: the sweep reaches its CREATE TYPE within 1 s
    with watch.cursor() as cursor:
        while time.monotonic() < deadline and opener.is_alive():
            cursor.execute("select count(*) from pg_stat_activity where datname = 'made_at_once' "
                           "and wait_event = 'PgSleep'")
            if cursor.fetchone()[0]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the sweep never reached its CREATE TYPE: {outcome}")
        cursor.execute("set session_replication_role = replica")  # the other sweep: no pause
        cursor.execute("create type studydirection as enum ('NOT_SET', 'MINIMIZE', 'MAXIMIZE')")
    watch.close()
    opener.join(120)  # quiet: 4-5 s
    assert "error" not in outcome and "storage" in outcome, outcome
    assert outcome["storage"].get_all_studies() == []
