"""packrl sweep's many-machines target (issue 39): two sweeps in two folders share one PostgreSQL study and finish N
trials between them, no trial number twice; then the same with one of them SIGKILLed mid-trial, the other running
the study to N.

A real PostgreSQL server (Debian's package: initdb in a temporary folder, a loopback port; as the postgres user when
run as root, since postgres refuses root). Each sweep is ``packrl sweep cartpole --storage URL --study NAME`` in its
own folder, as two machines would run it. Prints, per study: trials per state, which sweep ran which trial numbers,
any number seen twice, the wall time, and the machine.

    .venv/bin/python benchmarks/sweep_shared.py [--trials 12] [--budget 4096]
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from common import machine_line, print_table

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "pg-s3cret-Pw"
SPACE = "defaults = false\n[train]\nlearning_rate = { low = 1e-4, high = 3e-2 }\nnum_steps = 32\nupdate_epochs = 2\n" \
        "[vec]\nnum_envs = 8\n"


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name)]
    if not found[-1]:
        raise SystemExit(f"{name} not found: install Debian's postgresql (.ci/run does)")
    return found[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_server(start_timeout: float = 60.0) -> Iterator[str]:
    """A throwaway PostgreSQL server on a loopback port: yields its URL (user packrl, password PASSWORD)."""
    import psycopg2

    folder = Path(tempfile.mkdtemp(prefix="packrl-pg-"))
    as_user = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    pwfile = folder / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if as_user:
        shutil.chown(pwfile, "postgres", "postgres")
    subprocess.run([*as_user, _bin("initdb"), "-D", str(folder / "db"), "-U", "packrl", f"--pwfile={pwfile}",
                    "--auth=scram-sha-256"], check=True, capture_output=True)
    port = _free_port()
    server = subprocess.Popen([*as_user, _bin("postgres"), "-D", str(folder / "db"), "-p", str(port), "-k", str(folder),
                               "-c", "listen_addresses=127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"postgresql://packrl:{PASSWORD}@127.0.0.1:{port}/postgres"
    try:
        end = time.monotonic() + start_timeout
        while True:
            try:
                psycopg2.connect(url).close()
                break
            except psycopg2.OperationalError:
                if time.monotonic() > end or server.poll() is not None:
                    raise RuntimeError("postgres did not start") from None
                time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        server.wait(120)
        shutil.rmtree(folder, ignore_errors=True)


def start_sweep(url: str, out: Path, space: Path, study: str, trials: int, budget: int, seed: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "packrl", "sweep", "cartpole", "--trials", str(trials), "--budget",
                             str(budget), "--space", str(space), "--pruner", "none", "--storage", url, "--study", study,
                             "--seed", str(seed), "--out", str(out), "--no-live"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def study_trials(url: str, study: str) -> list[tuple[int, str]]:
    """(number, state) of every trial of ``study``."""
    import psycopg2

    with psycopg2.connect(url) as db, db.cursor() as cursor:
        cursor.execute("select t.number, t.state from trials t join studies s on s.study_id = t.study_id "
                       "where s.study_name = %s order by t.number", (study,))
        return cursor.fetchall()


def ran_by(folder: Path) -> set[int]:
    return {int(p.name) for p in (folder / "trials").iterdir() if p.is_dir()} if (folder / "trials").is_dir() else set()


def first_trial_under_way(folder: Path) -> bool:
    return any(p.read_text().count("\n") >= 2 for p in folder.glob("trials/*/history.jsonl") if p.is_file())


def run_pair(url: str, work: Path, study: str, trials: int, budget: int, kill: bool) -> list:
    """Two sweeps on ``study``; with ``kill`` the first is SIGKILLed once a trial of it is two iterations in."""
    space = work / "space.toml"
    space.write_text(SPACE)
    tic = time.perf_counter()
    a, b = (start_sweep(url, work / f"{study}-{x}", space, study, trials, budget, seed) for x, seed in (("a", 0), ("b", 1)))
    if kill:
        while not first_trial_under_way(work / f"{study}-a") and a.poll() is None:
            time.sleep(0.2)
        a.kill()
    outputs = [p.communicate(timeout=1800) for p in (a, b)]
    wall = time.perf_counter() - tic
    if b.returncode != 0 or (not kill and a.returncode != 0):
        raise SystemExit(f"a sweep failed: {outputs}")
    if any(PASSWORD in text for pair in outputs for text in pair):
        raise SystemExit("the password was printed")
    rows = study_trials(url, study)
    numbers = [n for n, _ in rows]
    states = {s: [n for n, st in rows if st == s] for s in sorted({st for _, st in rows})}
    twice = sorted({n for n in numbers if numbers.count(n) > 1})
    ran = [sorted(ran_by(work / f"{study}-{x}")) for x in ("a", "b")]
    print(f"  {study}: {', '.join(f'{k} {len(v)}' for k, v in states.items())}; sweep a ran {ran[0]}, sweep b ran "
          f"{ran[1]}; numbers twice: {twice or 'none'}; {wall:.0f} s", flush=True)
    return [study, "first SIGKILLed mid-trial" if kill else "both to the end", len(states.get("COMPLETE", [])),
            len(states.get("FAIL", [])), len(ran[0]), len(ran[1]), "none" if not twice else twice, round(wall)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="N: the trials the study finishes")
    parser.add_argument("--budget", type=int, default=4096)
    args = parser.parse_args()
    print(machine_line(("optuna", "psycopg2")), flush=True)
    with postgres_server() as url, tempfile.TemporaryDirectory() as tmp:
        rows = [run_pair(url, Path(tmp), "shared", args.trials, args.budget, kill=False),
                run_pair(url, Path(tmp), "shared-kill", args.trials, args.budget, kill=True)]
    print_table(f"two packrl sweeps on one PostgreSQL study, N = {args.trials} trials of {args.budget:,} agent steps",
                ["study", "run", "complete", "failed (cut)", "trials run by a", "by b", "numbers twice", "wall s"],
                rows)


if __name__ == "__main__":
    main()
