"""benchmarks/model_forms.py: its contenders train the same run (the fx form and the policy's own forms give the
plain modules' weight bytes), and it refuses an unknown task or form with one line."""
import subprocess
import sys
from pathlib import Path

from tests.benchmark_modules import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def test_the_forms_train_the_same_weights(monkeypatch):
    forms = load_benchmark("model_forms")
    env_id, backend, preset, _ = forms.TASKS["gridworld"]
    monkeypatch.setitem(forms.TASKS, "gridworld", (env_id, backend, preset, 2))
    runs = {form: forms.run_one("gridworld", form) for form in ("default", "modules", "fx")}
    assert all(run["steps"] == 2 * 32 * 32 and run["seconds"] > 0 for run in runs.values())
    assert len({run["sha"] for run in runs.values()}) == 1, runs


def test_the_fx_form_is_refused_where_the_policy_reads_the_host(monkeypatch):
    forms = load_benchmark("model_forms")
    env_id, backend, preset, _ = forms.TASKS["minigrid"]
    monkeypatch.setitem(forms.TASKS, "minigrid", (env_id, backend, preset, 1))
    assert forms.run_one("minigrid", "fx") == {"seconds": None, "steps": 0, "sha": "n/a"}


def test_an_unknown_form_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, "benchmarks/model_forms.py", "--forms", "default,bogus"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # quiet: the whole test takes under 1 s
    assert out.returncode == 2 and "unknown task or form 'bogus'" in out.stderr and "Traceback" not in out.stderr
