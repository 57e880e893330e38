"""Prioritized replay against brute force: the Numba sum tree against cumsum + searchsorted, and the buffer's
probabilities, draws and importance weights against a dict of priorities replayed from the same stream."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import chisquare

from packrl.errors import UsageError
from packrl.train.replay import ReplayBuffer
from packrl.train.sumtree import new_trees, tree_find, tree_set
from tests.replay_streams import GAMMA, ReferencePriorities, add, check_nstep, reference_slots, stream

priorities = st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1e3)), min_size=1, max_size=70)


@given(priorities, st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=20), st.integers(0, 2**31))
def test_sum_tree_search_equals_prefix_sum_search(values, fractions, seed):
    values = np.array(values)
    if values.sum() == 0:
        values[0] = 1.0
    sums, mins = new_trees(len(values))
    rng = np.random.default_rng(seed)
    for leaf in rng.permutation(len(values)):  # any order of updates, with overwrites on the way
        tree_set(sums, mins, leaf, 5.0)
        tree_set(sums, mins, leaf, values[leaf])
    cumsum = np.cumsum(values)
    assert sums[1] == pytest.approx(cumsum[-1], rel=1e-12)
    assert mins[1] == values[values > 0].min()
    for fraction in fractions:
        mass = fraction * cumsum[-1]
        leaf = tree_find(sums, mass)
        assert values[leaf] > 0, "never an empty leaf"
        expected = min(int(np.searchsorted(cumsum, mass, side="right")), len(values) - 1)
        if leaf != expected:  # only where the two sums round differently at a boundary
            assert abs(cumsum[leaf] - mass) < 1e-9 * cumsum[-1] or abs(cumsum[expected] - mass) < 1e-9 * cumsum[-1]


@given(st.integers(0, 2**31), st.integers(1, 4), st.integers(2, 40), st.integers(2, 12), st.integers(1, 3),
       st.sampled_from([0.0, 0.3, 0.6]), st.sampled_from([0.0, 0.25]), st.sampled_from([0.0, 0.6, 1.0]),
       st.sampled_from([0.0, 0.4, 1.0]))
def test_prioritized_buffer_matches_brute_force(seed, rows, steps, capacity, n, p_end, p_mask, alpha, beta):
    rng = np.random.default_rng(seed)
    events = stream(rng, steps, rows, p_end, p_mask)
    eps = 1e-6
    buf = ReplayBuffer(capacity, rows, (), np.int64, gamma=GAMMA, seed=seed, prioritized=True, alpha=alpha,
                       beta=beta, priority_eps=eps)
    ref = ReferencePriorities(rows, capacity, alpha, eps)
    for t, event in enumerate(events):
        add(buf, event)
        ref.add(event)
        if not ref.priority:
            continue
        assert np.allclose(buf.probabilities().ravel(), ref.probabilities(), rtol=1e-9, atol=0)
        clone = np.random.Generator(np.random.PCG64())
        clone.bit_generator.state = buf.rng.bit_generator.state
        batch = buf.sample(16, n)
        expected, cumsum, mass = ref.sample(clone.random(16))
        near_boundary = np.min(np.abs(cumsum[None, :] - mass[:, None]), axis=1) < 1e-9 * cumsum[-1]
        assert np.all((batch.indices == expected) | near_boundary)
        assert np.allclose(batch.weights, ref.weights(batch.indices, beta), rtol=1e-5)
        check_nstep(batch, reference_slots(events[: t + 1], rows, capacity), n, rows)
        if t % 3 == 0:  # new priorities for the sampled transitions, some of them 0
            new = np.abs(rng.normal(size=16)) * (rng.random(16) < 0.8)
            assert buf.update_priorities(batch, new) == 0
            ref.update(batch.indices, new)
            assert buf.max_priority == pytest.approx(ref.max_priority)


def test_draws_follow_priorities():
    """Chi-square of 100k stratified draws against p_i**alpha / sum, on a buffer with episode ends."""
    rng = np.random.default_rng(5)
    rows, capacity = 3, 20
    buf = ReplayBuffer(capacity, rows, (), np.int64, gamma=GAMMA, seed=5, prioritized=True, alpha=0.7)
    for event in stream(rng, 30, rows, 0.3, 0.0):
        add(buf, event)
    first = buf.sample(buf.transitions * 4)
    buf.update_priorities(first, rng.exponential(size=first.indices.size))
    p = buf.probabilities().ravel()
    draws = np.concatenate([buf.sample(1000).indices for _ in range(100)])
    held = np.flatnonzero(p)
    counts = np.array([np.count_nonzero(draws == f) for f in held])
    assert counts.sum() == draws.size
    assert chisquare(counts, p[held] * draws.size).pvalue > 1e-3
    # the same draws are far from uniform (the test can tell the two apart)
    assert chisquare(counts).pvalue < 1e-6


def test_an_overwritten_slot_keeps_its_new_priority():
    buf = ReplayBuffer(4, 1, (), np.int64, gamma=GAMMA, seed=0, prioritized=True)
    step = lambda i: buf.add(np.array([i]), np.array([i]), np.zeros(1, np.float32), np.zeros(1, bool),  # noqa: E731
                             np.zeros(1, bool), np.array([i]))
    for i in range(4):
        step(i)
    batch = buf.sample(8)
    for i in range(4, 12):  # the ring wraps twice: every sampled slot now holds another transition
        step(i)
    before = buf.probabilities().copy()
    assert buf.update_priorities(batch, np.full(8, 100.0)) == 8
    assert np.array_equal(buf.probabilities(), before)
    with pytest.raises(UsageError, match="priorities must have shape \\(8,\\)"):
        buf.update_priorities(batch, np.ones(3))
    with pytest.raises(UsageError, match="sample 2 has nan"):
        buf.update_priorities(batch, np.array([1, 1, np.nan, 1, 1, 1, 1, 1.0]))
