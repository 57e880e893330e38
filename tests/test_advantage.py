"""Advantage kernels against the float64 reference on random rollouts with random episode ends."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from packrl.train.advantage import (
    advantages_cuda,
    advantages_numba,
    advantages_torch,
    compute_advantages,
    reference_advantages,
)


@st.composite
def rollouts(draw):
    T, N = draw(st.integers(1, 24)), draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_end = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    data = dict(
        values=rng.normal(size=(T, N)).astype(np.float32),
        rewards=rng.normal(size=(T, N)).astype(np.float32),
        terminals=rng.random((T, N)) < p_end / 2,
        truncations=rng.random((T, N)) < p_end / 2,
        final_values=rng.normal(size=(T, N)).astype(np.float32),
        next_value=rng.normal(size=N).astype(np.float32),
        masks=None if draw(st.booleans()) else rng.random((T, N)) < draw(st.sampled_from([0.2, 0.7])),
        ratios=None if draw(st.booleans()) else rng.uniform(0.0, 2.5, (T, N)).astype(np.float32),
    )
    params = dict(gamma=draw(st.sampled_from([0.0, 0.9, 0.99, 1.0])), gae_lambda=draw(st.sampled_from([0.0, 0.95, 1.0])),
                  rho_clip=draw(st.sampled_from([1.0, 2.0])), c_clip=draw(st.sampled_from([0.5, 1.0])))
    return data, params


@given(rollouts())
def test_numba_kernel_matches_float64_reference(case):
    data, params = case
    expected = reference_advantages(**data, **params)
    np.testing.assert_allclose(advantages_numba(**data, **params), expected, rtol=1e-4, atol=1e-4)


@given(rollouts())
def test_torch_loop_matches_float64_reference(case):
    data, params = case
    tensors = {k: None if v is None else torch.from_numpy(v) for k, v in data.items()}
    expected = reference_advantages(**data, **params)
    np.testing.assert_allclose(advantages_torch(**tensors, **params).numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@given(rollouts())
def test_cuda_kernel_matches_float64_reference(case):
    data, params = case
    tensors = {k: None if v is None else torch.from_numpy(v).cuda() for k, v in data.items()}
    expected = reference_advantages(**data, **params)
    np.testing.assert_allclose(advantages_cuda(**tensors, **params).cpu().numpy(), expected, rtol=1e-4, atol=1e-4)


def _one_row(**overrides):
    T = 3
    data = dict(values=np.zeros((T, 1), np.float32), rewards=np.ones((T, 1), np.float32),
                terminals=np.zeros((T, 1), bool), truncations=np.zeros((T, 1), bool),
                final_values=np.zeros((T, 1), np.float32), next_value=np.zeros(1, np.float32))
    data.update(overrides)
    return data


def test_truncation_bootstraps_final_value_and_termination_bootstraps_zero():
    """Step 1 ends; the next episode's first value (values[2] = 100) must never leak into step 1."""
    values = np.array([[0.0], [0.0], [100.0]], np.float32)
    final = np.array([[0.0], [10.0], [0.0]], np.float32)
    ends = np.array([[False], [True], [False]])
    trunc = advantages_numba(**_one_row(values=values, final_values=final, truncations=ends), gamma=0.5, gae_lambda=1.0)
    term = advantages_numba(**_one_row(values=values, final_values=final, terminals=ends), gamma=0.5, gae_lambda=1.0)
    assert trunc[1, 0] == pytest.approx(1.0 + 0.5 * 10.0)
    assert term[1, 0] == pytest.approx(1.0)
    assert trunc[0, 0] == pytest.approx(1.0 + 0.5 * trunc[1, 0])


def test_last_step_bootstraps_next_value():
    adv = advantages_numba(**_one_row(next_value=np.array([4.0], np.float32)), gamma=0.5, gae_lambda=1.0)
    assert adv[2, 0] == pytest.approx(1.0 + 0.5 * 4.0)


def test_masked_steps_get_zero_and_carry_their_reward_back():
    masks = np.array([[True], [False], [True]])
    adv = advantages_numba(**_one_row(masks=masks), gamma=1.0, gae_lambda=1.0)
    assert adv[1, 0] == 0.0
    assert adv[0, 0] == pytest.approx(1.0 + 1.0 + adv[2, 0])  # own reward + the masked step's reward + chain


def test_vtrace_clips_the_importance_ratio():
    ratios = np.full((3, 1), 3.0, np.float32)
    clipped = advantages_numba(**_one_row(), ratios=ratios, rho_clip=1.0, c_clip=1.0, gamma=0.9, gae_lambda=1.0)
    plain = advantages_numba(**_one_row(), gamma=0.9, gae_lambda=1.0)
    np.testing.assert_allclose(clipped, plain, rtol=1e-6)
    loose = advantages_numba(**_one_row(), ratios=ratios, rho_clip=2.0, c_clip=1.0, gamma=0.9, gae_lambda=1.0)
    assert loose[2, 0] == pytest.approx(2.0 * plain[2, 0])


def test_dispatch_keeps_the_input_kind_and_refuses_bad_shapes():
    data = _one_row()
    assert isinstance(compute_advantages(**data), np.ndarray)
    assert isinstance(compute_advantages(**{k: torch.from_numpy(v) for k, v in data.items()}), torch.Tensor)
    with pytest.raises(ValueError, match="next_value"):
        compute_advantages(**{**data, "next_value": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="terminals"):
        compute_advantages(**{**data, "terminals": np.zeros((2, 1), bool)})
