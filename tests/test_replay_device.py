"""Samples on the learner's device: nativized structured observations, zero-copy views on CPU, pinned buffers
and non-blocking copies on CUDA (skipped without a GPU), all equal to the numpy sample of the same draw."""
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces

from packrl import envs
from packrl.emulation import Layout
from packrl.nativize import nativize
from packrl.train.replay import ReplayBuffer

SPACE = spaces.Dict({"image": spaces.Box(0, 255, (5, 5, 2), np.uint8), "pos": spaces.Box(-1, 1, (3,), np.float64),
                     "count": spaces.Box(-2**40, 2**40, (), np.int64), "dir": spaces.Discrete(4, start=-1)})


def _filled(prioritized=False):
    layout = Layout.from_space(SPACE)
    buf = ReplayBuffer(32, 3, layout=layout, action_shape=(2,), gamma=0.9, seed=1, prioritized=prioritized)
    SPACE.seed(1)
    for t in range(40):
        obs = np.stack([layout.pack(SPACE.sample()) for _ in range(3)])
        buf.add(obs, np.full((3, 2), t), np.ones(3, np.float32), np.array([t % 9 == 8, False, False]),
                np.array([False, t % 7 == 6, False]), obs[::-1].copy())
    return buf


def _same_draw(buf, device, n=3):
    """The sample on ``device`` and the numpy sample of the same draw (the RNG state put back in between)."""
    state = buf.rng.bit_generator.state
    on_device = buf.sample(64, n, device=device)
    buf.rng.bit_generator.state = state
    return on_device, buf.sample(64, n)


def _assert_equal(on_device, host):
    for key in SPACE.spaces:
        assert on_device.observations[key].dtype == getattr(torch, host.observations[key].dtype.name)
        assert np.array_equal(on_device.observations[key].cpu().numpy(), host.observations[key]), key
        assert np.array_equal(on_device.next_observations[key].cpu().numpy(), host.next_observations[key]), key
    for field in ("actions", "returns", "discounts", "weights"):
        assert np.array_equal(getattr(on_device, field).cpu().numpy(), getattr(host, field)), field
    assert np.array_equal(on_device.indices, host.indices)


@pytest.mark.parametrize("prioritized", [False, True])
def test_cpu_samples_are_nativized_views_of_the_gathered_rows(prioritized):
    buf = _filled(prioritized)
    on_cpu, host = _same_draw(buf, "cpu")
    _assert_equal(on_cpu, host)
    assert on_cpu.observations["dir"].shape == (64,) and on_cpu.observations["image"].shape == (64, 5, 5, 2)
    # the same structure, dtypes and values as packrl.nativize of the same rows
    rows = torch.from_numpy(buf.observations.reshape(-1, buf.layout.nbytes)[on_cpu.indices])
    native = nativize(rows, buf.layout)
    assert list(native) == list(on_cpu.observations)
    for key in SPACE.spaces:
        assert native[key].dtype == on_cpu.observations[key].dtype and torch.equal(native[key], on_cpu.observations[key])
    # zero-copy: each leaf is a strided view of the same gathered rows (row stride nbytes, at its own offset)
    leaves = {leaf.path[0]: leaf for leaf in buf.layout.leaves}
    base = on_cpu.observations["image"].data_ptr() - leaves["image"].offset
    for key in SPACE.spaces:
        view = on_cpu.observations[key]
        assert view.data_ptr() - base == leaves[key].offset, key
        assert view.stride(0) * view.element_size() == buf.layout.nbytes, key

def _copy(x):
    return x.numpy().copy() if isinstance(x, torch.Tensor) else x.copy()


@pytest.mark.parametrize("device", [None, "cpu"])
def test_a_batch_or_one_leaf_kept_is_never_overwritten_by_later_samples(device):
    """Samples are gathered into recycled blocks; a block is reused only once nothing made from it is alive."""
    buf = _filled()
    batch = buf.sample(64, 2, device=device)
    leaf = buf.sample(64, 2, device=device).next_observations["image"]  # the batch itself is dropped
    kept_batch = {key: _copy(batch.observations[key]) for key in SPACE.spaces}
    kept_leaf = _copy(leaf)
    blocks = [buf.sample(64, 2, device=device) for _ in range(6)]  # more than the pool holds, all alive
    for _ in range(6):
        buf.sample(64, 2, device=device)
    for key in SPACE.spaces:
        assert np.array_equal(_copy(batch.observations[key]), kept_batch[key])
    assert np.array_equal(_copy(leaf), kept_leaf)
    del batch, leaf, blocks
    pool = next(iter(buf._blocks.values()))
    assert any(sys.getrefcount(pool[i]) == 2 for i in range(len(pool))), "dropped samples free their blocks"


def test_a_box_env_gives_its_own_rows():
    """packrl's Numba CartPole passes its Box through: the samples are its float32 rows, not bytes."""
    env = envs.make("cartpole", num_envs=4, seed=0)
    buf = ReplayBuffer.for_env(env, 16, gamma=0.9, seed=0)
    obs, _ = env.reset()
    for _ in range(10):
        before = obs.copy()
        actions = np.zeros(4, np.int64)
        obs, rewards, terms, truncs, _ = env.step(actions)
        buf.add(before, actions, rewards, terms, truncs, env.final_observations)
    batch = buf.sample(8, 2, device="cpu")
    assert batch.observations.dtype == torch.float32 and batch.observations.shape == (8, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("prioritized", [False, True])
def test_cuda_samples_match_and_survive_the_next_sample(prioritized):
    buf = _filled(prioritized)
    on_gpu, host = _same_draw(buf, "cuda")
    assert on_gpu.observations["image"].device.type == "cuda"
    _assert_equal(on_gpu, host)
    # The pinned host buffers are reused: three more samples must not change a batch already handed out.
    kept = {key: on_gpu.observations[key].clone() for key in SPACE.spaces}
    first = buf.sample(64, 3, device="cuda")
    for _ in range(3):
        buf.sample(64, 3, device="cuda")
    torch.cuda.synchronize()
    for key in SPACE.spaces:
        assert torch.equal(on_gpu.observations[key], kept[key])
    state = buf.rng.bit_generator.state
    again = buf.sample(64, 3, device="cuda")
    buf.rng.bit_generator.state = state
    _assert_equal(again, buf.sample(64, 3))
    assert first.returns.device.type == "cuda"
