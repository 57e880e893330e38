"""Action distributions against torch.distributions references: categoricals (masked, multi-branch),
bounded Gaussians (finite, half-infinite, infinite bounds), hybrids."""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st
from torch.distributions import (
    AffineTransform,
    Categorical,
    Normal,
    SoftplusTransform,
    TanhTransform,
    TransformedDistribution,
)

from packrl.emulation import ActionLayout
from packrl.models import ActionSpec, apply_mask

nvecs = st.lists(st.integers(1, 7), min_size=1, max_size=4)


@given(nvec=nvecs, seed=st.integers(0, 2**16))
def test_multidiscrete_log_prob_and_entropy_match_per_branch_categoricals(nvec, seed):
    gen = torch.Generator().manual_seed(seed)
    spec = ActionSpec(ActionLayout(spaces.MultiDiscrete(nvec)))
    logits = torch.randn(5, sum(nvec), generator=gen) * 3
    mask = torch.rand(5, sum(nvec), generator=gen) > 0.3
    dist = spec.distribution(apply_mask(logits, mask))
    action = dist.sample()
    assert action.shape == (5, len(nvec)) and action.dtype == torch.int64
    want_lp, want_ent, first = torch.zeros(5), torch.zeros(5), 0
    for j, n in enumerate(nvec):
        m, branch = mask[:, first:first + n], logits[:, first:first + n]
        none = ~m.any(-1, keepdim=True)  # a fully masked branch is uniform over its choices
        m, branch = m | none, torch.where(none, torch.zeros_like(branch), branch)
        ref = Categorical(logits=branch.masked_fill(~m, -float("inf")))
        want_lp += ref.log_prob(action[:, j])
        want_ent += ref.entropy()
        assert m.gather(1, action[:, j:j + 1]).all(), "sampled a masked choice"
        first += n
    torch.testing.assert_close(dist.log_prob(action), want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist.entropy(), want_ent, rtol=1e-5, atol=1e-5)


def test_mask_respected_over_10k_samples_and_excluded_from_entropy():
    spec = ActionSpec(ActionLayout(spaces.Discrete(6)))
    logits = torch.tensor([[5.0, 0.0, 9.0, -1.0, 0.5, 2.0]]).expand(10_000, 6)
    mask = torch.tensor([[0, 1, 0, 1, 1, 0]], dtype=torch.int8).expand(10_000, 6)
    dist = spec.distribution(apply_mask(logits, mask))
    action = dist.sample()
    assert action.shape == (10_000,)
    counts = torch.bincount(action, minlength=6)
    assert counts[[0, 2, 5]].sum() == 0 and (counts[[1, 3, 4]] > 0).all()
    ref = Categorical(logits=torch.tensor([0.0, -1.0, 0.5]))
    assert torch.allclose(dist.entropy()[0], ref.entropy())
    assert dist.probs[0, 0, [0, 2, 5]].eq(0).all()
    assert dist.mode()[0] == 4


@pytest.mark.parametrize("nvec", [(6,), (2, 5, 3)])
def test_sample_frequencies_match_the_probabilities(nvec):
    """The sampler (an exponential race) draws each choice with its probability: per-branch counts over
    200k draws are within 5 standard deviations of n p, and choices of probability 0 (masked, and the
    padding of narrower branches) are never drawn."""
    torch.manual_seed(0)
    spec = ActionSpec(ActionLayout(spaces.MultiDiscrete(nvec)))
    logits = torch.randn(sum(nvec)) * 2
    mask = torch.ones(sum(nvec), dtype=torch.bool)
    mask[1] = False
    n = 200_000
    dist = spec.distribution(apply_mask(logits, mask).expand(n, -1))
    action, log_prob = dist.sample_with_log_prob()
    torch.testing.assert_close(log_prob, dist.log_prob(action))
    action = action.reshape(n, len(nvec))
    first = 0
    for j, width in enumerate(nvec):
        branch = logits[first:first + width].masked_fill(~mask[first:first + width], -float("inf"))
        p = torch.softmax(branch.double(), -1)
        counts = torch.bincount(action[:, j], minlength=width).double()
        assert counts.numel() == width, "drew a padding choice"
        assert counts[p == 0].sum() == 0, "drew a masked choice"
        sigma = (n * p * (1 - p)).sqrt()
        assert ((counts - n * p).abs() <= 5 * sigma + 1e-9).all(), (counts, n * p)
        first += width


def test_all_masked_row_is_uniform_not_nan():
    spec = ActionSpec(ActionLayout(spaces.Discrete(4)))
    dist = spec.distribution(apply_mask(torch.randn(3, 4), torch.zeros(3, 4, dtype=torch.bool)))
    assert torch.allclose(dist.entropy(), torch.full((3,), float(np.log(4))))
    assert torch.isfinite(dist.log_prob(dist.sample())).all()


BOUNDS = [  # (low, high) per dimension: finite, lower only, upper only, none
    (np.array([-2.0, 0.5], np.float32), np.array([3.0, 0.75], np.float32)),
    (np.array([1.0, -np.inf], np.float32), np.array([np.inf, 4.0], np.float32)),
    (np.full(3, -np.inf, np.float32), np.full(3, np.inf, np.float32)),
]


def _reference(mean, std, low, high):
    """torch.distributions reference of one dimension's bounded Gaussian."""
    base = Normal(mean, std)
    if np.isfinite(low) and np.isfinite(high):
        return TransformedDistribution(base, [TanhTransform(), AffineTransform(float(low + high) / 2, float(high - low) / 2)])
    if np.isfinite(low):
        return TransformedDistribution(base, [SoftplusTransform(), AffineTransform(float(low), 1.0)])
    if np.isfinite(high):
        return TransformedDistribution(base, [AffineTransform(0.0, -1.0), SoftplusTransform(), AffineTransform(float(high), -1.0)])
    return base


@pytest.mark.parametrize("low,high", BOUNDS)
def test_box_log_prob_matches_transformed_reference_and_stays_in_bounds(low, high):
    torch.manual_seed(0)
    layout = ActionLayout(spaces.Box(low, high, dtype=np.float32))
    spec = ActionSpec(layout)
    m = len(low)
    mean, log_std = torch.randn(2000, m), torch.randn(2000, m) * 0.5
    dist = spec.distribution(torch.cat([mean, log_std], -1))
    action = dist.sample()
    want = sum(_reference(mean[:, j], log_std[:, j].exp(), low[j], high[j]).log_prob(action[:, j])
               for j in range(m))
    ok = torch.isfinite(want)  # the reference is -inf/NaN where float32 tanh saturates to the bound exactly
    assert ok.float().mean() > 0.95
    torch.testing.assert_close(dist.log_prob(action)[ok], want[ok], rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(dist.entropy(), Normal(mean, log_std.exp()).entropy().sum(-1))
    env_action = spec.to_numpy(action)
    assert env_action.dtype == np.float32 and env_action.shape == (2000, m)
    assert np.all(env_action >= low) and np.all(env_action <= high)
    for row in env_action[:50]:
        layout.decode(row)  # the emulation layer accepts every sampled action


def test_box_log_prob_is_finite_with_gradients_at_the_bounds():
    spec = ActionSpec(ActionLayout(spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, np.inf]), dtype=np.float64)))
    logits = torch.zeros(2, 4, requires_grad=True)
    action = torch.tensor([[1.0, 0.0], [-1.0, 1e9]])
    lp = spec.distribution(logits).log_prob(action)
    lp.sum().backward()
    assert torch.isfinite(lp).all() and torch.isfinite(logits.grad).all()
    assert spec.to_numpy(action).dtype == np.float64


def test_hybrid_log_prob_and_entropy_are_sums_of_parts():
    space = spaces.Dict({"move": spaces.Discrete(3, start=-1), "aim": spaces.Box(-1, 1, (2,), np.float32),
                         "flags": spaces.MultiBinary(2)})
    layout = ActionLayout(space)
    spec = ActionSpec(layout)
    logits = torch.randn(4, spec.logits_size)
    dist = spec.distribution(logits)
    action = dist.sample()
    assert set(action) == {"discrete", "continuous"}
    assert action["discrete"].shape == (4, 3) and action["continuous"].shape == (4, 2)
    d = spec.num_discrete
    disc = ActionSpec(ActionLayout(spaces.MultiDiscrete(layout.nvec))).distribution(logits[:, :d])
    cont = ActionSpec(ActionLayout(spaces.Box(-1, 1, (2,), np.float32))).distribution(logits[:, d:])
    torch.testing.assert_close(dist.log_prob(action), disc.log_prob(action["discrete"]) + cont.log_prob(action["continuous"]))
    torch.testing.assert_close(dist.entropy(), disc.entropy() + cont.entropy())
    drawn, log_prob = dist.sample_with_log_prob()  # the rollout's form: the log-prob of the drawn action
    torch.testing.assert_close(log_prob, dist.log_prob(drawn))
    native = layout.decode({k: v[0] for k, v in spec.to_numpy(action).items()})
    assert space.contains(native)


def test_wrong_logits_width_is_refused():
    from packrl import EmulationError

    with pytest.raises(EmulationError, match="width 5"):
        ActionSpec(ActionLayout(spaces.Discrete(5))).distribution(torch.zeros(2, 4))


@given(nvec=nvecs, scalar=st.booleans(), seed=st.integers(0, 2**16))
def test_sampling_into_storage_with_drawn_noise_matches_the_distribution(nvec, scalar, seed):
    """The rollout's form: Gumbel noise drawn for every step at once (``ActionSpec.fill_noise``), then each step
    written into storage (``sample_into``). The action is argmax(log p + noise) per branch, never a masked choice,
    and the stored log-prob is the distribution's log_prob of it."""
    if scalar:
        nvec = nvec[:1]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    spec = ActionSpec(ActionLayout(spaces.Discrete(nvec[0]) if scalar else spaces.MultiDiscrete(nvec)))
    logits = torch.randn(6, sum(nvec), generator=gen) * 3
    mask = torch.rand(6, sum(nvec), generator=gen) > 0.3
    dist = spec.distribution(apply_mask(logits, mask))
    noise = spec.empty_noise((3, 6), torch.device("cpu"))
    actions = spec.empty_actions((3, 6), torch.device("cpu"))
    log_probs = torch.zeros(3, 6)
    spec.fill_noise(noise)
    assert torch.isfinite(noise).all() and noise.std() > 0.5
    for t in range(3):
        out = actions[t].unsqueeze(-1) if scalar else actions[t]
        dist.sample_into(noise[t], out, log_probs[t])
        want = (dist.log_probs + noise[t]).argmax(-1)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(log_probs[t], dist.log_prob(actions[t]))
        chosen = torch.stack([mask[:, sum(nvec[:i]):][:, :n].gather(-1, out[:, i:i + 1]).squeeze(-1)
                              for i, n in enumerate(nvec)], -1)
        allowed = torch.stack([mask[:, sum(nvec[:i]):][:, :n].any(-1) for i, n in enumerate(nvec)], -1)
        assert torch.all(chosen | ~allowed), "a masked choice was drawn where the branch had an allowed one"


@pytest.mark.parametrize("nvec", [(6,), (2, 5, 3)])
def test_frequencies_of_the_rollout_sampler_match_the_probabilities(nvec):
    torch.manual_seed(0)
    spec = ActionSpec(ActionLayout(spaces.MultiDiscrete(nvec)))
    dist = spec.distribution(torch.randn(1, sum(nvec)).expand(20_000, -1))
    noise = spec.empty_noise((20_000,), torch.device("cpu"))
    spec.fill_noise(noise)
    actions, log_probs = spec.empty_actions((20_000,), torch.device("cpu")), torch.zeros(20_000)
    dist.sample_into(noise, actions, log_probs)
    for i, n in enumerate(nvec):
        freq = torch.bincount(actions[:, i], minlength=n).float() / 20_000
        probs = dist.probs[0, i, :n]
        assert torch.all((freq - probs).abs() < 5 * (probs * (1 - probs) / 20_000).sqrt() + 1e-3), (freq, probs)


def test_box_sampled_from_drawn_noise_is_the_squashed_gaussian_draw():
    spec = ActionSpec(ActionLayout(spaces.Box(-2.0, 3.0, (3,), np.float32)))
    logits = torch.randn(4, spec.logits_size)
    dist = spec.distribution(logits)
    noise = spec.empty_noise((4,), torch.device("cpu"))
    spec.fill_noise(noise)
    action, log_prob = dist.sample_with_log_prob(noise)
    torch.testing.assert_close(action, dist.bounds.squash(dist.mean + dist.std * noise))
    torch.testing.assert_close(log_prob, dist.log_prob(action))
    assert torch.all((action >= -2.0) & (action <= 3.0))


def test_unsquashed_box_actions_are_gaussian_draws_clipped_only_for_the_env():
    """squash=False (CleanRL's ppo_continuous_action): the stored action is the Gaussian draw itself, its
    log-probability the Gaussian's, and only the array handed to the env is clipped into the space's bounds."""
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))
    spec = ActionSpec(ActionLayout(space), squash=False)
    torch.manual_seed(0)
    logits = torch.cat([torch.tensor([[0.5, 1.0]]).expand(4096, 2), torch.full((4096, 2), 0.7)], -1)
    dist = spec.distribution(logits)
    action, log_prob = dist.sample_with_log_prob()
    ref = Normal(torch.tensor([0.5, 1.0]), torch.tensor(0.7).exp())
    torch.testing.assert_close(log_prob, ref.log_prob(action).sum(-1))
    assert (action[:, 0] > 1.0).any() and (action[:, 1] < 0.0).any()  # draws beyond the bounds are kept as drawn
    sent = spec.to_numpy(action)
    assert sent.dtype == np.float32 and np.all(sent >= space.low) and np.all(sent <= space.high)
    np.testing.assert_allclose(sent, np.clip(action.numpy(), space.low, space.high))
    squashed = ActionSpec(ActionLayout(space)).distribution(logits).sample()
    assert np.all(squashed.numpy() >= space.low) and np.all(squashed.numpy() <= space.high)
