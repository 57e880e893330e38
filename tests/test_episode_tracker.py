"""EpisodeTracker.record: a rollout's episode returns and lengths, computed once per rollout, equal a step-by-step
count (episodes spanning rollouts, masked steps, several ends per row in one rollout)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from packrl.train.ppo import EpisodeTracker


def _reference(rollouts, rows):
    """The per-step rule: every step adds its reward and (if the row acted) one to the length; an end records
    (return, length, row) in step order, rows ascending, and starts the row over."""
    returns, lengths, finished = np.zeros(rows), np.zeros(rows, np.int64), []
    for rewards, ended, acted in rollouts:
        for t in range(rewards.shape[0]):
            returns += rewards[t]
            lengths += acted[t]
            for row in np.flatnonzero(ended[t]):
                finished.append((float(returns[row]), int(lengths[row]), int(row)))
            returns[ended[t]], lengths[ended[t]] = 0.0, 0
    return finished


@st.composite
def rollouts(draw):
    steps, rows = draw(st.integers(1, 12)), draw(st.integers(1, 6))
    count = draw(st.integers(1, 4))
    out = []
    for _ in range(count):
        rewards = draw(arrays(np.float32, (steps, rows), elements=st.floats(-10, 10, width=32)))
        ended = draw(arrays(np.bool_, (steps, rows)))
        acted = draw(arrays(np.bool_, (steps, rows)))
        out.append((rewards, ended, acted))
    return out, rows


@settings(max_examples=150, deadline=None)
@given(rollouts())
def test_record_equals_the_step_by_step_count(case):
    data, rows = case
    tracker = EpisodeTracker(rows)
    for rewards, ended, acted in data:
        tracker.record(rewards, ended, acted)
    assert tracker.finished == _reference(data, rows)


def test_an_episode_spanning_rollouts_keeps_its_return_and_pop_reports_per_agent():
    tracker = EpisodeTracker(2, agents=("a", "b"))
    no_end = np.zeros((3, 2), bool)
    tracker.record(np.ones((3, 2), np.float32), no_end, np.ones((3, 2), bool))
    assert tracker.finished == []
    ended = np.zeros((2, 2), bool)
    ended[1, 0] = True
    acted = np.array([[True, False], [True, True]])
    tracker.record(np.full((2, 2), 0.5, np.float32), ended, acted)
    assert tracker.finished == [(4.0, 5, 0)]
    assert tracker.pop() == {"episodes": 1, "episode_return": 4.0, "episode_length": 5.0, "episode_return/a": 4.0}
    assert tracker.returns.tolist() == [0.0, 4.0] and tracker.lengths.tolist() == [0, 4]
