"""Replay a user's first hour with packrl and check what they would see (issue 42).

The commands a person types in their first hour, each in a fresh process as a shell runs it (not a terminal):
train CartPole, eval, plot and inspect its run, resume it, stop a run with Ctrl-C (SIGINT), train a PettingZoo
game and a MiniGrid id, and give a bad value. Each must end with its exit code, its results on stdout and its
errors and stops on stderr (nothing on stderr when all went well); no line may be a library's log (gymnasium's
warnings, BabyAI's sampler, pygame, Ray's C++ client, Python warnings); and no number may be wrong (a progress
past 100%, "1 rows", a closing step count other than the last progress line's, an eval or resume that names
another step than the checkpoint holds).

    python scripts/first_hour.py [--workdir DIR]

Prints one line per command to stdout; each failed check on stderr. Exit 0 when every check held, 1 when one
did not, 2 for a bad flag. About a minute on two cores.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY_LOGS = [
    re.compile(p) for p in (
        r"\bWARN\b", r"\w+Warning\b", r"warnings\.warn", r"Sampling rejected", r"XDG_RUNTIME_DIR",
        r"Hello from the pygame community", r"^pygame \d", r"^\[\d{4}-\d\d-\d\d [\d:,.]+ [DIWE] \d+ \d+\]",
        r"\bINFO worker\.py", r"^\d{4}-\d\d-\d\d [\d:,.]+\s+(INFO|WARNING)\b", r"^Traceback",
    )
]
PROGRESS = re.compile(r"^\[\s*([\d,]+)/([\d,]+)\s+([\d.]+)%\]")
CLOSING = re.compile(r"^last mean episode return .* after ([\d,]+) agent steps$")
ONE_PLURAL = re.compile(r"\b1 (rows|leaves|envs|episodes|steps|iterations|agents|games)\b")


@dataclass
class Replay:
    """The commands run so far and the checks that failed."""

    workdir: Path
    failures: list[str] = field(default_factory=list)

    def packrl(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "COLUMNS": "120", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        return subprocess.run([sys.executable, "-m", "packrl", *args], cwd=self.workdir, env=env,
                              capture_output=True, text=True, timeout=900)

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)

    def judge(self, command: str, done: subprocess.CompletedProcess, code: int, stderr_lines: int | None = 0) -> None:
        """Exit code, what stderr holds, and the checks every output gets; one line on stdout."""
        before = len(self.failures)
        self.check(done.returncode == code, f"{command}: exit code {done.returncode}, expected {code}\n{done.stderr}")
        errors = done.stderr.strip().splitlines()
        if stderr_lines is not None:
            self.check(len(errors) == stderr_lines,
                       f"{command}: {len(errors)} lines on stderr, expected {stderr_lines}: {errors[:5]}")
        for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
            for line in text.splitlines():
                log = next((p.pattern for p in LIBRARY_LOGS if p.search(line)), None)
                self.check(log is None, f"{command}: a library's log on {stream} ({log}): {line[:160]}")
                self.check(ONE_PLURAL.search(line) is None, f"{command}: a singular counted as plural: {line[:160]}")
                progress = PROGRESS.match(line)
                if progress:
                    n, total, percent = (float(g.replace(",", "")) for g in progress.groups())
                    self.check(n <= total and percent <= 100.0 and abs(percent - 100 * n / total) < 0.1,
                               f"{command}: a wrong progress figure: {line[:80]}")
        print(f"{'ok  ' if len(self.failures) == before else 'FAIL'} packrl {command}", flush=True)

    def closing_steps(self, command: str, stdout: str) -> int | None:
        """The steps the closing line names, checked against the last progress line's."""
        last = [PROGRESS.match(line) for line in stdout.splitlines() if PROGRESS.match(line)]
        closing = [CLOSING.match(line) for line in stdout.splitlines() if CLOSING.match(line)]
        self.check(bool(last) and len(closing) == 1, f"{command}: no progress line or no one closing line:\n{stdout}")
        if not (last and closing):
            return None
        steps = int(closing[0].group(1).replace(",", ""))
        self.check(steps == int(last[-1].group(1).replace(",", "")),
                   f"{command}: the closing line says {steps:,} steps, the last progress line {last[-1].group(1)}")
        return steps


def steps_in_checkpoint(folder: Path) -> int:
    return json.loads((folder / "checkpoint" / "metadata.json").read_text())["global_step"]


def replay(workdir: Path) -> list[str]:
    """Every command of the first hour, judged; the failed checks."""
    r = Replay(workdir)
    first = workdir / "runs" / "first"

    done = r.packrl("train", "CartPole-v1", "--total-steps", "4096", "--name", "first", "--no-live")
    r.judge("train CartPole-v1", done, 0)
    r.check(r.closing_steps("train CartPole-v1", done.stdout) == steps_in_checkpoint(first) == 4096,
            "train CartPole-v1: the closing steps, the checkpoint's and 4,096 differ")
    r.check("checkpoint: runs/first/checkpoint (sha256 " in done.stdout, "train: no checkpoint line with its hash")

    done = r.packrl("eval", "runs/first", "--episodes", "4")
    r.judge("eval runs/first", done, 0)
    r.check(f"trained {steps_in_checkpoint(first):,} steps" in done.stdout, "eval: the steps trained are not the "
            f"checkpoint's {steps_in_checkpoint(first):,}:\n{done.stdout}")
    r.check(re.search(r"^mean return -?\d", done.stdout, re.M) is not None, "eval: no mean return line")

    done = r.packrl("plot", "runs/first")
    r.judge("plot runs/first", done, 0)
    r.check((first / "learning_curve.png").is_file() and "learning curve: runs/first/learning_curve.png" in done.stdout,
            "plot: no learning curve named and written")

    done = r.packrl("inspect", "runs/first")
    r.judge("inspect runs/first", done, 0)
    r.check(re.search(r"hashes\s+│\s+match", done.stdout) is not None, "inspect: the hashes do not say match")

    done = r.packrl("train", "--resume", "runs/first", "--total-steps", "8192", "--no-live")
    r.judge("train --resume runs/first", done, 0)
    r.check("(step 4,096, its recorded settings)" in done.stdout and "8,192 agent steps, from 4,096" in done.stdout,
            f"resume: not resumed from step 4,096 to 8,192:\n{done.stdout}")
    r.check(r.closing_steps("train --resume", done.stdout) == steps_in_checkpoint(first) == 8192,
            "resume: the closing steps, the checkpoint's and 8,192 differ")

    r.judge(*ctrl_c(r), stderr_lines=2)

    done = r.packrl("train", "pettingzoo.classic.tictactoe_v3", "--total-steps", "2048", "--no-live", "--name", "game",
                    "--versus-every", "2", "--versus-games", "6")
    r.judge("train pettingzoo.classic.tictactoe_v3", done, 0)
    r.check(re.search(r"^against a uniformly random legal opponent \(iteration \d+, step [\d,]+\): win [\d.]+, "
                      r"draw [\d.]+, loss [\d.]+", done.stdout, re.M) is not None,
            f"game: no closing score against a random opponent:\n{done.stdout}")

    done = r.packrl("train", "MiniGrid-Empty-5x5-v0", "--total-steps", "2048", "--no-live", "--name", "grid")
    r.judge("train MiniGrid-Empty-5x5-v0", done, 0)
    r.closing_steps("train MiniGrid-Empty-5x5-v0", done.stdout)

    done = r.packrl("train", "CartPole-v1", "--train.gamma", "2")
    r.judge("train CartPole-v1 --train.gamma 2", done, 2, stderr_lines=1)
    r.check(done.stdout == "" and "--train.gamma 2: expected a float in [0, 1]" in done.stderr,
            f"a bad value: not one line naming it on stderr, or something on stdout:\n{done.stdout}{done.stderr}")
    return r.failures


def ctrl_c(r: Replay) -> tuple[str, subprocess.CompletedProcess, int]:
    """A long run stopped by SIGINT once its first iteration is written: exit 130, a checkpoint, the way to resume."""
    env = {**os.environ, "COLUMNS": "120", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "packrl", "train", "CartPole-v1", "--total-steps", "10000000", "--name", "stopped",
            "--no-live", "--checkpoint-minutes", "0"]
    process = subprocess.Popen(argv, cwd=r.workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    history = r.workdir / "runs" / "stopped" / "history.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None and not (history.is_file() and history.stat().st_size):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=600)
    done = subprocess.CompletedProcess(argv, process.returncode, out, err)
    r.check("continue with: packrl train --resume runs/stopped" in err and "checkpoint saved" in err,
            f"Ctrl-C: stderr does not say what was saved and how to continue:\n{err}")
    r.check((r.workdir / "runs" / "stopped" / "checkpoint" / "metadata.json").is_file(), "Ctrl-C: no checkpoint")
    return "train (stopped by Ctrl-C)", done, 130


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="first_hour.py", description="Replay a user's first hour with packrl and check what "
                           "they see.")
    parser.add_argument("--workdir", type=Path, help="the folder to run in (default: a fresh temporary one)")
    args = parser.parse_args(argv)
    if args.workdir is not None and not args.workdir.is_dir():
        print(f"first_hour.py: --workdir {args.workdir}: no such folder", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="packrl-first-hour-") as scratch:
        failures = replay(args.workdir or Path(scratch))
    for failure in failures:
        print(f"first hour: {failure}", file=sys.stderr)
    print(f"first hour: {'every check held' if not failures else f'{len(failures)} checks failed'}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
