"""`packrl train MiniGrid-DoorKey-5x5-v0` learns with its defaults (the minigrid preset), bounded by frames.

benchmarks/learning_minigrid.py measures the same run over seeds, with wall time and torch-ac side by side."""
from collections import deque

import numpy as np
import pytest

from packrl import config as settings
from packrl.train.ppo import EpisodeTracker
from packrl.train.run import build_ppo

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def frames_to_mean(env_id: str, threshold: float, budget: int, seed: int = 0,
                   window: int = 100) -> tuple[int | None, str]:
    """Train with ``env_id``'s defaults until the last ``window`` finished training episodes average
    ``threshold``: ``(frames then, or None within budget, the preset's name)``."""
    config, preset = settings.resolve(flags={"env": {"id": env_id}, "train": {"seed": seed, "total_steps": budget}})
    ppo = build_ppo(config)
    returns: deque = deque(maxlen=window)

    class Recording(EpisodeTracker):
        def pop(self) -> dict:
            returns.extend(r for r, _, _ in self.finished)
            return super().pop()

    ppo.episodes = Recording(ppo.num_rows, ppo.episodes.agents)
    hit: list = []

    def stop_at_threshold(stats: dict) -> bool:
        if len(returns) == window and np.mean(returns) >= threshold:
            hit.append(stats["global_step"])
        return not hit

    ppo.train(budget, stop_at_threshold)
    ppo.env.close()
    return (hit[0] if hit else None), preset.name


@pytest.mark.slow
def test_doorkey_defaults_reach_0_9_within_100k_frames():
    """The 0.9 mark is the issue's DoorKey-5x5 target. Seed 0 meets it at 47,104 frames (23 iterations of 2,048;
    seeds 1, 2: 38,912 and 51,200); the image read as intensities (the 'cnn' encoder, the preset before) stood
    at 0.04 after 100k frames."""
    frames, preset = frames_to_mean("MiniGrid-DoorKey-5x5-v0", 0.9, 100_000)
    assert preset == "minigrid"
    assert frames is not None, "the moving mean of 100 training episodes never reached 0.9 within 100k frames"


@pytest.mark.slow
def test_doorkey_6x6_defaults_reach_0_9_within_100k_frames():
    """Issue 30's DoorKey-6x6 target. benchmarks/minigrid_stability.py (5-iteration means), seeds 0-2: 0.9 at
    98,304, 71,680 and 90,112 frames, never below 0.918 after it within 150k; the preset before (lambda 0.95,
    lr 1e-3, a shared critic) met it on seed 0 alone. Seeds 3 and 4 miss (0.85 and 0.03 at 100k)."""
    frames, preset = frames_to_mean("MiniGrid-DoorKey-6x6-v0", 0.9, 100_000, seed=1)
    assert preset == "minigrid"
    assert frames is not None, "the moving mean of 100 training episodes never reached 0.9 within 100k frames"


@pytest.mark.slow
def test_fetch_defaults_reach_0_9_within_300k_frames():
    """Fetch names its target object only in the mission: the mission's words steer the grid encoder (FiLM).
    Without that, seed 0 stood at 0.74 after 300k frames (the two objects near a coin flip until 100k)."""
    frames, preset = frames_to_mean("MiniGrid-Fetch-5x5-N2-v0", 0.9, 300_000, seed=1)
    assert preset == "minigrid"
    assert frames is not None, "the moving mean of 100 training episodes never reached 0.9 within 300k frames"
