"""The live view on a real terminal: the README's main command and ``packrl train`` run in a pseudo-terminal
(what a person's shell gives them), so the rich live path runs as it does for them."""
import fcntl
import io
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from rich.console import Console

from packrl.train.dashboard import Dashboard

ROOT = Path(__file__).resolve().parents[1]
HIDE_CURSOR = "\x1b[?25l"  # rich.live hides the cursor while it redraws: the live path ran


def run_on_pty(cmd: list[str], timeout: float = 300.0, signal_when: tuple[str, int] | None = None) -> tuple[int, str]:
    """Run ``cmd`` with stdin, stdout and stderr on a fresh pseudo-terminal of 120 x 40; its exit code
    and everything it wrote. ``signal_when=(text, signum)``: send ``signum`` once ``text`` was written."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "CI", "FORCE_COLOR")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env, start_new_session=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: every process holding the terminal closed it
                    break
                if not data:
                    break
                chunks.append(data)
                if signal_when is not None and signal_when[0] in b"".join(chunks).decode(errors="replace"):
                    proc.send_signal(signal_when[1])
                    signal_when = None
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError(f"{cmd} ran past {timeout} s:\n" + b"".join(chunks).decode(errors="replace")[-3000:])
        # quiet: this file's tests take at most 3 s
        return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)


def test_the_readme_main_command_runs_live_on_a_terminal(tmp_path):
    out = tmp_path / "demo"
    rc, text = run_on_pty([sys.executable, "examples/train_demo.py", "--total-steps", "2048", "--out", str(out)])
    assert rc == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert HIDE_CURSOR in text and "ETA" in text and "steps/s" in text and "100%" in text
    assert (out / "checkpoint" / "metadata.json").is_file()


def test_packrl_train_runs_live_on_a_terminal(tmp_path):
    out = tmp_path / "run"
    rc, text = run_on_pty([sys.executable, "-m", "packrl.cli", "train", "gridworld", "--total-steps", "2048",
                           "--num-envs", "8", "--train.num_steps", "64", "--hidden", "16", "--out", str(out)])
    assert rc == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert HIDE_CURSOR in text and "policy loss" in text and "2048/2048" in text
    assert (out / "checkpoint" / "metadata.json").is_file()


def test_ctrl_c_on_a_terminal_says_it_will_save_then_saves(tmp_path):
    out = tmp_path / "run"
    rc, text = run_on_pty([sys.executable, "-m", "packrl.cli", "train", "CartPole-v1", "--num-envs", "2",
                           "--total-steps", "100000000", "--train.num_steps", "256", "--out", str(out)],
                          signal_when=("steps/s", signal.SIGINT))
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "SIGINT: stopping at the end of this iteration to save a checkpoint" in text
    assert f"packrl train --resume {out}" in text.replace("\r\n", "")
    assert (out / "checkpoint" / "metadata.json").is_file()


def test_the_dashboard_draws_on_a_terminal_console():
    """In process, on a console that says it is a terminal: building, updating and closing the live view."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with Dashboard("title", 1000, live=True, console=console) as board:
        board.update({"global_step": 500, "iteration": 1, "sps": 10.0, "episode_return": 0.5,
                      "episode_return/player_0": 1.0, "vs_random/win": 0.75, "vs_random/draw": 0.0,
                      "vs_random/loss": 0.25})
        board.live.refresh()
    drawn = buffer.getvalue()
    assert HIDE_CURSOR in drawn and "500/1000" in drawn and "return of player_0" in drawn
    assert "0.75 / 0.00 / 0.25" in drawn and "50%" in drawn


def test_log_lines_off_a_terminal_carry_total_percentage_and_eta():
    buffer = io.StringIO()
    board = Dashboard("title", 1000, live=False, log_seconds=0.0, console=Console(file=buffer, width=200))
    with board:
        time.sleep(0.01)
        board.update({"global_step": 250, "iteration": 1, "sps": 10.0, "episode_return": 0.5})
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("title: 1,000 agent steps")
    assert "250/1,000" in lines[1] and "25.0%" in lines[1] and "ETA 0:" in lines[1] and "episode return 0.500" in lines[1]
