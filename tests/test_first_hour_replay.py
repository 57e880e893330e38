"""scripts/first_hour.py replays a user's first hour (train, eval, plot, inspect, resume, Ctrl-C, a game, a
MiniGrid id, a bad value) in fresh processes and checks what they see (issue 42): every check holds on the
current tree, and each of its checks catches what it is there for."""
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "first_hour.py"


def load_script():
    spec = importlib.util.spec_from_file_location("first_hour", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["first_hour"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_first_hour_holds(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=1800)  # quiet: the whole test takes 18 s
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "first hour: every check held" and done.stderr == ""
    assert sum(line.startswith("ok   packrl ") for line in done.stdout.splitlines()) == 9


def test_each_check_catches_what_it_is_for(tmp_path, capsys):
    first_hour = load_script()
    cases = {
        "a library's log": ("", "/venv/gymnasium/core.py:311: UserWarning: WARN: env.foo to get variables\n"),
        "a wrong progress figure": ("[  1,024/100 1024.0%] 3,240 steps/s mean\n", ""),
        "a singular counted as plural": ("packrl PPO on CartPole-v1 (1 rows, cpu)\n", ""),
        "lines on stderr": ("", "an error nobody expected\n"),
        "exit code": ("", ""),
    }
    for what, (out, err) in cases.items():
        replay = first_hour.Replay(tmp_path)
        code = 1 if what == "exit code" else 0
        replay.judge("x", subprocess.CompletedProcess(["packrl"], code, out, err), 0)
        assert any(what in failure for failure in replay.failures), (what, replay.failures)
        assert "FAIL packrl x" in capsys.readouterr().out
    replay = first_hour.Replay(tmp_path)
    replay.judge("x", subprocess.CompletedProcess(["packrl"], 0, "[  4,096/4,096 100.0%] ok\n", ""), 0)
    assert replay.failures == []
    assert replay.closing_steps("x", "[  4,096/4,096 100.0%]\nlast mean episode return 9.0 after 4,000 agent steps\n") \
        == 4000 and "the closing line says 4,000 steps" in replay.failures[-1]


def test_a_bad_flag_is_one_line_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path / "missing")], capture_output=True,
                          text=True, timeout=60)  # quiet: the whole test takes under 1 s
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"first_hour.py: --workdir {tmp_path / 'missing'}: no such folder"]
    # quiet: the whole test takes under 1 s
    done = subprocess.run([sys.executable, str(SCRIPT), "--work"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "--work" in done.stderr
