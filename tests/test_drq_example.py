"""examples/drq_minigrid.py: a few hundred steps run end to end on MiniGrid pixels (stacked images of the shape
the network expects, finite losses), the acting side's frame stacks are exactly the ones the replay buffer
builds at sample time for the same observations, and (slow) the greedy return passes the example's
threshold after 2,000 env steps."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from packrl import vector
from packrl.train.replay import ReplayBuffer

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "drq_minigrid.py"


@pytest.fixture(scope="module")
def drq():
    spec = importlib.util.spec_from_file_location("drq_minigrid", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_a_few_hundred_steps_run_on_stacked_pixels(drq):
    torch.set_num_threads(1)
    config = drq.Config(total_steps=300, learning_starts=200, eval_every=10_000, eval_episodes=2, batch_size=16)
    result = drq.train(config, log=lambda line: None)
    assert result["sampled_shape"] == (16, 3, 28, 28, 3)  # (batch, frames, H, W, RGB)
    assert len(result["losses"]) == (300 - 200) // 4 + 1 and np.all(np.isfinite(result["losses"]))
    buffer = result["buffer"]
    assert len(buffer) >= 300 and buffer.observations.shape[2:] == (2624,), "each frame stored once, in its row"


def test_acting_stacks_equal_the_buffers_sampled_stacks(drq):
    """Random play with short episodes: the stack the agent acted on at each step equals the stack the buffer
    builds for the stored observation of that step (padding at episode starts included)."""
    env = vector.make(lambda: drq.make_env("MiniGrid-Empty-5x5-v0"), 3, backend="serial", seed=1)
    layout = env.emulated.observation
    k = 3
    buffer = ReplayBuffer.for_env(env, 512, frame_stack=k, frame_stack_leaf="image")
    obs, _ = env.reset(seed=1)
    stacks = drq.FrameStacks(layout.unpack(obs)["image"], k)
    rng = np.random.default_rng(0)
    acted, ends = [], 0
    for _ in range(150):
        acted.append(stacks.images.copy())
        taken_at = obs.copy()
        obs, rewards, terms, truncs, _ = env.step(rng.integers(0, 3, 3))
        buffer.add(taken_at, rng.integers(0, 3, 3), rewards, terms, truncs, env.final_observations)
        stacks.push(layout.unpack(obs)["image"], terms | truncs)
        ends += int((terms | truncs).sum())
    assert ends >= 3, "the check needs episode starts to pad"
    image = next(leaf for leaf in layout.leaves if leaf.path == ("image",))
    rows = buffer.observations.reshape(-1, layout.nbytes)[:, image.offset: image.offset + image.nbytes]
    checked = 0
    for row in range(3):
        slots = [s for s in range(len(buffer.last)) if s < buffer.count[row]]
        steps = [s for s in slots if not buffer.last[s, row]]  # the slots of steps, in order (no wrap at 512)
        assert len(steps) == 150
        for t, slot in enumerate(steps):
            frames = buffer.stack_indices(np.array([slot * 3 + row]))[0]
            built = rows[frames].reshape(k, *image.shape)
            assert np.array_equal(built, acted[t][row]), (row, t)
            checked += 1
    assert checked == 450


@pytest.mark.slow
def test_drq_learns_empty_5x5_from_pixels(drq):
    torch.set_num_threads(1)
    config = drq.Config(total_steps=2_000, eval_every=2_000, eval_episodes=16)
    result = drq.train(config, log=lambda line: None)
    assert result["final"] >= drq.LEARNED_THRESHOLD, result["history"]
