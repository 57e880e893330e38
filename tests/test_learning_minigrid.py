"""`packrl train MiniGrid-DoorKey-5x5-v0` learns with its defaults (the minigrid preset), bounded by frames.

benchmarks/learning_minigrid.py measures the same run over seeds, with wall time and torch-ac side by side."""
import pytest

from tests.learning_runs import best_of_seeds

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.slow
def test_doorkey_defaults_reach_0_9_within_100k_frames():
    """The 0.9 mark is the issue's DoorKey-5x5 target, as the best of seeds 0-2 (tried in turn). Seed 0 meets
    it at 47,104 frames (23 iterations of 2,048; seeds 1, 2: 38,912 and 51,200); the image read as intensities
    (the 'cnn' encoder, the preset before) stood at 0.04 after 100k frames."""
    best_of_seeds("MiniGrid-DoorKey-5x5-v0", 0.9, 100_000, seeds=(0, 1, 2), preset="minigrid")


@pytest.mark.slow
def test_doorkey_6x6_defaults_reach_0_9_within_100k_frames_on_one_of_seeds_0_to_2():
    """Issue 30's DoorKey-6x6 target, as the best of seeds 0-2 (tried in turn until one meets it): a single seed's
    trajectory follows the CPU's floating-point kernels (issue 42: on one AMD EPYC seed 1 met it with
    ATEN_CPU_CAPABILITY=default only, on another with avx2 only), and a test that rests on one trajectory fails as
    soon as it moves. The spread per seed and per kernel set is benchmarks/minigrid_stability.py --capability
    default,avx2 (benchmarks/README.md, MiniGrid stability)."""
    best_of_seeds("MiniGrid-DoorKey-6x6-v0", 0.9, 100_000, seeds=(0, 1, 2), preset="minigrid")


@pytest.mark.slow
def test_fetch_defaults_reach_0_9_within_300k_frames():
    """Fetch names its target object only in the mission: the mission's words steer the grid encoder (FiLM).
    The best of seeds 1 and 0 (tried in turn). Without that, seed 0 stood at 0.74 after 300k frames (the two
    objects near a coin flip until 100k)."""
    best_of_seeds("MiniGrid-Fetch-5x5-N2-v0", 0.9, 300_000, seeds=(1, 0), preset="minigrid")
