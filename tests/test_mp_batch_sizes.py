"""Every ``(num_envs, num_workers, batch_size, main_envs)`` the multiprocessing backend documents
builds, resets and steps each env in its own row; every other one is refused with a UsageError
naming its numbers, before any process starts.

The documented rules (README, ``vector.make``, ``Multiprocessing``): ``num_workers`` processes split
``num_envs - main_envs`` envs evenly, at least one each; ``main_envs > 0`` only when every env steps
at once (``batch_size == num_envs``); a smaller ``batch_size`` divides ``num_envs`` and is whole
workers. ``main_envs=None`` picks a share that splits evenly.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packrl import vector
from packrl.errors import UsageError
from packrl.vector.multiprocessing import default_split, usable_cores
from packrl.vector.testing import ScriptedEnv

MAX_ENVS, MAX_WORKERS = 12, 3


def allowed(n: int, w: int, b: int, m: int | None) -> bool:
    """The documented rules, written out independently of the backend's own check."""
    if b < 1 or n % b:
        return False
    if m is None:  # the backend picks the main share: any split where every worker gets an env
        if b == n:
            return n >= w
        m = 0
    if m < 0 or n - m < w or (n - m) % w:
        return False
    if b == n:
        return True
    return m == 0 and b % ((n - m) // w) == 0


GRID = [(n, w, b, m) for n in range(1, MAX_ENVS + 1) for w in range(1, MAX_WORKERS + 1)
        for b in range(1, n + 1) for m in [None, *range(0, n + 1)]]
ALLOWED = [c for c in GRID if allowed(*c)]


def _refusal(n: int, w: int, b: int, m: int | None) -> str:
    with pytest.raises(UsageError) as caught:
        vector.make(ScriptedEnv, n, backend="multiprocessing", num_workers=w, batch_size=b, main_envs=m,
                    context="fork")
    return str(caught.value)


def test_every_refused_combination_names_its_numbers():
    refused = [c for c in GRID if not allowed(*c)]
    assert len(refused) > 100 and len(ALLOWED) > 100  # the grid covers both sides
    for n, w, b, m in refused:
        message = _refusal(n, w, b, m)
        # the message names the rule it broke with the numbers involved
        names = {f"batch_size={b}", f"num_workers={w}", f"main_envs={m}"}
        assert any(name in message for name in names), (n, w, b, m, message)
        assert str(n) in message or f"main_envs={m}" in message, (n, w, b, m, message)


def test_the_issue_cases_build():
    """Issue 19: num_workers=2, batch_size=num_envs raised at 8, 64 and 256 envs (main share ignored)."""
    for n in (8, 64, 256):
        assert allowed(n, 2, n, None)
        with vector.make(ScriptedEnv, n, backend="multiprocessing", num_workers=2, batch_size=n,
                         context="fork") as venv:
            assert venv.main_envs > 0 and (n - venv.main_envs) % 2 == 0
            _check_steps(venv, n, n)


def _check_steps(venv, n: int, b: int) -> np.ndarray:
    """Batches until every env stepped twice: each env's reward is 0 before its first step, then
    its step count + its action / 10 (episodes last at least 3 steps, so none ends by then).
    ``recv`` returns the first workers to finish, so under load one worker may serve several
    batches before a slow one's first; the loop waits for every env (a bound, not a timing)."""
    actions = np.arange(n) % 3
    sent = np.zeros(n, np.int64)
    venv.async_reset(seed=5)
    deadline = time.monotonic() + 60  # quiet: this file's tests take at most 2 s
    while (sent < 2).any():
        assert time.monotonic() < deadline, f"envs {np.flatnonzero(sent < 2).tolist()} never came back"
        batch = venv.recv()
        ids = np.asarray(batch.env_ids)
        assert len(ids) == b and len(set(ids.tolist())) == b
        if b == n:
            np.testing.assert_array_equal(ids, np.arange(n))
        early = sent[ids] <= 2
        expected = np.where(sent[ids] == 0, 0.0, sent[ids] + actions[ids] / 10)
        np.testing.assert_allclose(batch.rewards[early], expected[early], rtol=1e-6)
        venv.send(actions[ids])
        sent[ids] += 1
    return sent


def test_every_allowed_combination_up_to_5_envs_builds_resets_and_steps():
    small = [case for case in ALLOWED if case[0] <= 5]
    assert len(small) == 42
    for case in small:
        _build_and_step(*case)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.sampled_from([case for case in ALLOWED if case[0] > 5]))
def test_allowed_combinations_of_6_to_12_envs_build_reset_and_step(case):
    assert (_build_and_step(*case) >= 2).all()


def _build_and_step(n: int, w: int, b: int, m: int | None) -> np.ndarray:
    """How often each env was sent actions (after the checks of ``_check_steps``)."""
    with vector.make(ScriptedEnv, n, backend="multiprocessing", num_workers=w, batch_size=b, main_envs=m,
                     context="fork") as venv:
        assert venv.num_workers == w
        assert venv.main_envs * (b != n) == 0
        assert venv.envs_per_worker * w + venv.main_envs == n
        return _check_steps(venv, n, b)


def test_default_split_fills_every_allowed_gap():
    """``main_envs=None`` (every env at once) never refuses a worker count that some main share fits."""
    for n in range(1, MAX_ENVS + 1):
        for w in range(1, min(n, MAX_WORKERS) + 1):
            workers, main = default_split(n, n, w, None)
            assert workers == w and (n - main) % w == 0 and main <= n - w
            assert main <= n / (w + 1) or main == n % w  # the equal share, or the least that splits evenly


def test_default_workers_follow_the_usable_cores():
    """The default worker count reads the CPU affinity, not the machine's core count or the envs."""
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert usable_cores() == 1
        assert default_split(8, 8, None, None) == (1, 4)  # one worker beside the main process's share
        assert default_split(8, 2, None, None) == (1, 0)  # batches: one worker per usable core
    finally:
        os.sched_setaffinity(0, before)
    cores = usable_cores()
    assert cores == len(before)
    assert default_split(64, 64, None, None)[0] == max(1, cores - 1)
