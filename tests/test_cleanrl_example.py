"""examples/cleanrl_ppo.py (CleanRL's PPO on a packrl vector env of MiniGrid's structured observation) runs
a few iterations as a real subprocess on the serial and multiprocessing backends: exit 0, every
iteration's losses finite, and episode returns reported through gymnasium's RecordEpisodeStatistics. As in
CleanRL, the figures go to TensorBoard (runs/<run_name>), ``--capture-video`` records env 0 (videos/) and
``--track`` makes a W&B run (offline here) that holds the TensorBoard figures and the videos."""
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
def test_cleanrl_ppo_runs_on_packrl(backend, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "cleanrl_ppo.py"), "--total-timesteps", "1024",
                           "--num-steps", "64", "--backend", backend, "--cuda", "false"],
                          # quiet: the whole test takes 5 s
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    iterations = LOSSES.findall(done.stdout)
    assert [int(i[0]) for i in iterations] == [1, 2, 3, 4], done.stdout[-2000:]
    for _, *losses in iterations:
        assert all(math.isfinite(float(x)) for x in losses), losses
    returns = [float(r) for r in RETURNS.findall(done.stdout)]
    assert len(returns) >= 4, done.stdout[-2000:]  # 100-step episodes: 4 envs x 256 steps end several
    assert all(0.0 <= r <= 1.0 for r in returns), returns
    events = tensorboard_scalars(tmp_path / "runs")
    assert [step for step, _ in events["losses/value_loss"]] == [256, 512, 768, 1024]
    assert [float(f"{v:.6f}") for _, v in events["losses/value_loss"]] == [float(i[1]) for i in iterations]
    assert len(events["charts/episodic_return"]) == len(returns)


def tensorboard_scalars(runs):
    """{tag: [(step, value)]} of the one TensorBoard run under ``runs``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = runs.iterdir()
    events = EventAccumulator(str(run))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_track_and_capture_video_as_in_cleanrl(tmp_path):
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}  # no credentials: offline
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "cleanrl_ppo.py"), "--total-timesteps", "1024",
                           "--num-steps", "64", "--cuda", "false", "--track", "true", "--capture-video", "true"],
                          # quiet: the whole test takes 13 s
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (videos,) = (tmp_path / "videos").iterdir()
    recorded = sorted(videos.glob("rl-video-episode-*.mp4"))
    assert recorded and recorded[0].name == "rl-video-episode-0.mp4" and recorded[0].stat().st_size > 1000
    assert videos.name == next((tmp_path / "runs").iterdir()).name  # one run_name for TensorBoard and videos
    assert len(tensorboard_scalars(tmp_path / "runs")["losses/value_loss"]) == 4
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    synced = list((offline / "files").rglob("events.out.tfevents.*"))  # sync_tensorboard copies the event file
    uploaded = list((offline / "files" / "media" / "videos").glob("*.mp4"))
    assert len(synced) == 1 and len(uploaded) == len(recorded)


def test_capture_video_needs_the_serial_backend(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "cleanrl_ppo.py"), "--backend", "multiprocessing",
                           # quiet: the whole test takes 2 s
                           "--capture-video", "true"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 2 and "--capture-video records env 0" in done.stderr.splitlines()[-1]
