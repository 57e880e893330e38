"""PPO with the envs and the policy overlapped (PPOConfig.overlap, packrl/train/overlap.py): the envs made in two
halves (vector.make(..., backend="numba", halves=True)) step as one env of all copies would, and the overlapped
rollout fills storage exactly as the synchronous one does, over rollouts with updates between and episode ends
inside; what it cannot run is refused with one line."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packrl import UsageError, vector
from packrl.models import Policy
from packrl.train.ppo import PPO, PPOConfig

STORAGE = ("obs", "masks", "starts", "rewards", "terminals", "truncations", "actions", "logprobs", "values",
           "final_values", "next_value")


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 1000), half=st.integers(1, 6), steps=st.integers(1, 40))
def test_halves_step_as_one_env_of_all_copies(seed, half, steps):
    whole = vector.make("gridworld", 2 * half, backend="numba", seed=seed)
    halves = vector.make("gridworld", 2 * half, backend="numba", seed=seed, halves=True)
    try:
        np.testing.assert_array_equal(whole.reset(seed=seed)[0], halves.reset(seed=seed)[0])
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            actions = np.stack([rng.integers(0, n, 2 * half) for n in (4, 2)], -1)
            a, b = whole.step(actions), halves.step(actions)
            for x, y in zip(a[:4], b[:4]):
                np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(whole.final_observations, halves.final_observations)
            np.testing.assert_array_equal(whole.masks, halves.masks)
    finally:
        whole.close()
        halves.close()


def _run(env_id: str, overlap: bool, num_envs: int, max_episode_steps: int | None, seed: int = 0,
         device: str = "cpu") -> PPO:
    kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    env = vector.make(env_id, num_envs, backend="numba", seed=seed, halves=overlap, **kwargs)
    torch.manual_seed(seed)
    ppo = PPO(env, Policy.from_env(env, hidden=32), PPOConfig(num_steps=24, num_minibatches=2, update_epochs=2,
                                                              device=device, seed=seed, overlap=overlap))
    return ppo


def _iterations(env_id: str, overlap: bool, max_episode_steps: int | None, iterations: int = 3,
                device: str = "cpu", staged: bool | None = None) -> tuple:
    """Storage after each of ``iterations`` rollouts (an update after each), the updates' stats and the weights."""
    PPO.stage_on_host = staged
    try:
        ppo = _run(env_id, overlap, 8, max_episode_steps, device=device)
    finally:
        PPO.stage_on_host = None
    stored, stats = [], []
    try:
        for _ in range(iterations):
            ppo.collect()
            stored.append({name: getattr(ppo, name).clone() for name in STORAGE})
            stats.append(ppo.update())
        return stored, stats, [p.detach().clone() for p in ppo.policy.parameters()]
    finally:
        ppo.driver.close()
        ppo.env.close()


@pytest.mark.parametrize("staged", [None, True])
@pytest.mark.parametrize("env_id,max_episode_steps", [("cartpole", 15), ("gridworld", None)])
def test_the_overlapped_rollout_stores_what_the_synchronous_one_stores(env_id, max_episode_steps, staged):
    """``staged``: the CUDA path's host staging (pinned copies of the env arrays and actions) run on CPU."""
    (sync, sync_stats, sync_weights), (over, over_stats, over_weights) = (
        _iterations(env_id, overlap, max_episode_steps, staged=staged) for overlap in (False, True))
    for iteration, (a, b) in enumerate(zip(sync, over)):
        if env_id == "cartpole":  # the 15-step limit truncates inside every rollout
            assert a["truncations"].any() and a["final_values"].any()
        assert a["terminals"].any() or a["truncations"].any()
        for name in STORAGE:
            assert torch.equal(a[name], b[name]), (iteration, name)
    assert [s["pg_loss"] for s in sync_stats] == [s["pg_loss"] for s in over_stats]
    assert all(torch.equal(a, b) for a, b in zip(sync_weights, over_weights))


def test_what_overlap_cannot_run_is_refused_with_one_line():
    env = vector.make("cartpole", 4, backend="numba", seed=0)
    with pytest.raises(UsageError, match="halves=True"):
        PPO(env, Policy.from_env(env, hidden=8), PPOConfig(num_steps=4, device="cpu", overlap=True))
    env.close()
    halves = vector.make("cartpole", 4, backend="numba", seed=0, halves=True)
    with pytest.raises(UsageError, match="recurrent"):
        PPO(halves, Policy.from_env(halves, network="lstm", hidden=8), PPOConfig(num_steps=4, device="cpu", overlap=True))
    halves.close()
    with pytest.raises(UsageError, match="even num_envs"):
        vector.make("cartpole", 5, backend="numba", seed=0, halves=True)
    with pytest.raises(UsageError, match="even num_envs"):
        vector.make("cartpole", 1, backend="numba", seed=0, halves=True)


def test_an_env_error_in_the_worker_thread_reaches_the_caller_and_names_the_env():
    ppo = _run("cartpole", True, 4, None)
    try:
        ppo.storage.host_actions(0)[...] = 7  # CartPole has 2 actions: the env refuses step 0's actions of each half
        ppo.driver.sampler = lambda *args: None  # keep the bad actions the policy would overwrite
        with pytest.raises(Exception, match="env index"):
            ppo.collect()
    finally:
        ppo.driver.close()
        ppo.env.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("env_id,max_episode_steps", [("cartpole", 15), ("gridworld", None)])
def test_on_cuda_the_overlapped_graphs_store_what_the_synchronous_graphs_store(env_id, max_episode_steps):
    """On CUDA each (step, half) is a captured graph and the envs step while the device runs the other half's."""
    (sync, _, sync_weights), (over, _, over_weights) = (
        _iterations(env_id, overlap, max_episode_steps, device="cuda") for overlap in (False, True))
    for a, b in zip(sync, over):
        for name in STORAGE:
            torch.testing.assert_close(a[name], b[name], msg=name)
    for a, b in zip(sync_weights, over_weights):
        torch.testing.assert_close(a, b)
