"""benchmarks/rollout.py and benchmarks/gpu_check.py run here: the ops count sees both loops, and gpu_check's split
runs on CPU (its CUDA-only parts are the GPU session's)."""
import subprocess
import sys
from pathlib import Path

from tests.benchmark_modules import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def test_rollout_counts_ops_of_both_loops():
    rollout = load_benchmark("rollout")
    cleanrl_ops, cleanrl_us = rollout.measure(rollout.cleanrl_rollout, "cartpole", 4, repeats=1)
    packrl_ops, packrl_us = rollout.measure(rollout.packrl_rollout, "cartpole", 4, repeats=1)
    assert cleanrl_ops > 20 and 5 < packrl_ops < cleanrl_ops
    assert cleanrl_us > 0 and packrl_us > 0


def test_gpu_check_split_runs_on_cpu():
    out = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--split-envs", "16",
                          "--split-iterations", "1", "--num-envs", "16", "--train-seconds", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)  # quiet: the whole test takes 9 s
    assert out.returncode == 0, out.stderr[-2000:]
    assert "PPO split on cpu" in out.stdout and "gridworld" in out.stdout and "cartpole" in out.stdout
    assert "PPO on the Numba gridworld, 16 envs, cpu" in out.stdout
