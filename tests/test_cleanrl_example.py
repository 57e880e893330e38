"""examples/cleanrl_ppo.py (CleanRL's PPO on a packrl vector env of MiniGrid's structured observation) runs
a few iterations as a real subprocess on the serial and multiprocessing backends: exit 0, every
iteration's losses finite, and episode returns reported through gymnasium's RecordEpisodeStatistics."""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOSSES = re.compile(r"^iteration=(\d+) .*value_loss=(\S+) policy_loss=(\S+) entropy=(\S+) approx_kl=(\S+)", re.M)
RETURNS = re.compile(r"^global_step=\d+, episodic_return=(\S+)$", re.M)


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_cleanrl_ppo_runs_on_packrl(backend):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "cleanrl_ppo.py"), "--total-timesteps", "1024",
                           "--num-steps", "64", "--backend", backend, "--cuda", "false"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    iterations = LOSSES.findall(done.stdout)
    assert [int(i[0]) for i in iterations] == [1, 2, 3, 4], done.stdout[-2000:]
    for _, *losses in iterations:
        assert all(math.isfinite(float(x)) for x in losses), losses
    returns = [float(r) for r in RETURNS.findall(done.stdout)]
    assert len(returns) >= 4, done.stdout[-2000:]  # 100-step episodes: 4 envs x 256 steps end several
    assert all(0.0 <= r <= 1.0 for r in returns), returns
