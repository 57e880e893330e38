"""The running mean and variance that observation normalization and reward scaling keep: one merge rule for both."""
from __future__ import annotations

from typing import Any


def merge_moments(mean: Any, var: Any, count: Any, batch_mean: Any, batch_var: Any, batch_count: Any) -> tuple:
    """``(mean, var, count)`` of the samples behind ``(mean, var, count)`` and a batch's ``(batch_mean, batch_var,
    batch_count)``, population variances (Chan et al.'s parallel update, as gymnasium's RunningMeanStd). Plain
    arithmetic: floats, numpy arrays or torch tensors."""
    total = count + batch_count
    delta = batch_mean - mean
    merged_var = (var * count + batch_var * batch_count + delta * delta * count * batch_count / total) / total
    return mean + delta * batch_count / total, merged_var, total
