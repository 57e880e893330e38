"""A sum tree and a min tree over the same leaves, in Numba: proportional prioritized sampling.

Both trees are flat float64 arrays of ``2 * size`` nodes (``size`` a power of two): node 1 is the root, node
i has children 2i and 2i + 1, leaf j is node ``size + j``. A parent is always recomputed from its two
children (never updated by a difference), so no rounding drift builds up over millions of updates: every
node is exactly the float sum of its children. Empty leaves hold 0 in the sum tree and +inf in the min tree.
"""
from __future__ import annotations

import numpy as np
from numba import njit


def tree_size(leaves: int) -> int:
    """The smallest power of two that holds ``leaves`` leaves."""
    return 1 << max(int(leaves) - 1, 0).bit_length()


def new_trees(leaves: int) -> tuple[np.ndarray, np.ndarray]:
    """Empty (sum, min) trees for ``leaves`` leaves."""
    size = tree_size(leaves)
    return np.zeros(2 * size, np.float64), np.full(2 * size, np.inf, np.float64)


@njit(cache=True)
def tree_set(sums: np.ndarray, mins: np.ndarray, leaf: int, value: float) -> None:
    """Leaf ``leaf`` holds ``value`` (> 0), or is emptied with value 0."""
    size = sums.size // 2
    node = size + leaf
    sums[node] = value
    mins[node] = value if value > 0.0 else np.inf
    node //= 2
    while node >= 1:
        sums[node] = sums[2 * node] + sums[2 * node + 1]
        mins[node] = min(mins[2 * node], mins[2 * node + 1])
        node //= 2


@njit(cache=True)
def tree_find(sums: np.ndarray, mass: float) -> int:
    """The first leaf whose prefix sum exceeds ``mass`` (0 <= mass < total), i.e. ``searchsorted(cumsum,
    mass, 'right')``. It never lands on an empty leaf: where rounding leaves ``mass`` at or past the right
    subtree's sum, the walk takes the side that holds mass."""
    size = sums.size // 2
    node = 1
    while node < size:
        left = sums[2 * node]
        if (mass < left or sums[2 * node + 1] <= 0.0) and left > 0.0:
            node = 2 * node
        else:
            mass -= left
            node = 2 * node + 1
    return node - size
