"""The replay buffer's index work in Numba: which slots start a transition, and the n-step pass.

Slots are numbered flat, ``slot * num_rows + row`` (the storage is ``(capacity, num_rows, ...)``). A slot
*starts a transition* when it is a step (not an episode's final observation) and its successor is already
stored. Those slots are kept in a dense set (``starts[:count]`` with ``where[flat]`` its position, or -1), so a
uniform sample is ``starts[integers(0, count, batch)]``: cost per sample independent of the buffer's size and
of the share of episode ends, no rejection. Each write moves at most two slots in or out of the set, and,
when priorities are on, sets the same two leaves of the sum tree.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from packrl.train.sumtree import tree_find, tree_set


@njit(cache=True)
def _enter(flat: int, starts: np.ndarray, where: np.ndarray, held: np.ndarray) -> None:
    if where[flat] < 0:
        where[flat] = held[0]
        starts[held[0]] = flat
        held[0] += 1


@njit(cache=True)
def _leave(flat: int, starts: np.ndarray, where: np.ndarray, held: np.ndarray) -> None:
    k = where[flat]
    if k >= 0:
        held[0] -= 1
        moved = starts[held[0]]  # the set's last entry fills the hole
        starts[k] = moved
        where[moved] = k
        where[flat] = -1


@njit(cache=True)
def advance(rows: np.ndarray, is_last: bool, ptr: np.ndarray, count: np.ndarray, last: np.ndarray,
            starts: np.ndarray, where: np.ndarray, held: np.ndarray, sums: np.ndarray, mins: np.ndarray,
            new_priority: float, stamps: np.ndarray, clock: np.ndarray, slots: np.ndarray) -> None:
    """Claim the next slot of each row in ``rows`` (``slots[i]`` gets row i's), mark it ``is_last``, and keep
    the set of starts (and the trees, when ``sums`` is not empty) true: the slot being overwritten (the row's
    oldest, once the row is full) leaves; the row's previous newest slot, now given a successor, enters when
    it is a step."""
    capacity, num_rows = last.shape
    prioritized = sums.size > 0
    for i in range(rows.size):
        r = rows[i]
        s = ptr[r]
        flat = s * num_rows + r
        if where[flat] >= 0:
            _leave(flat, starts, where, held)
            if prioritized:
                tree_set(sums, mins, flat, 0.0)
        if count[r] > 0:
            prev = (s - 1) % capacity
            if not last[prev, r]:
                before = prev * num_rows + r
                _enter(before, starts, where, held)
                if prioritized:
                    tree_set(sums, mins, before, new_priority)
        last[s, r] = is_last
        if prioritized:
            clock[0] += 1
            stamps[flat] = clock[0]
        ptr[r] = (s + 1) % capacity
        count[r] = min(count[r] + 1, capacity)
        slots[i] = s


@njit(cache=True)
def draw(uniforms: np.ndarray, starts: np.ndarray, held: int, sums: np.ndarray, flat: np.ndarray,
         rows: np.ndarray, num_rows: int) -> None:
    """Starts for a batch from uniforms in [0, 1): ``starts[floor(u * held)]`` (uniform), or, when ``sums`` is
    not empty, a stratified proportional draw: draw i takes mass ``(i + u_i) * total / n``, one draw in each of
    n equal slices of the total (the prioritized replay paper's scheme, lower variance than i.i.d. draws)."""
    n = uniforms.size
    if sums.size > 0:
        total = sums[1]
        for i in range(n):
            flat[i] = tree_find(sums, (i + uniforms[i]) * total / n)
    else:
        for i in range(n):
            flat[i] = starts[min(int(uniforms[i] * held), held - 1)]
    for i in range(n):
        rows[i] = flat[i] % num_rows


@njit(cache=True)
def nstep(flat: np.ndarray, n: int, ptr: np.ndarray, count: np.ndarray, last: np.ndarray, rewards: np.ndarray,
          discounts: np.ndarray, returns: np.ndarray, discount: np.ndarray, steps: np.ndarray,
          next_flat: np.ndarray) -> None:
    """For each start ``flat[i]``: the discounted sum of up to ``n`` rewards, the product of the discounts
    over them (0 once a termination is crossed), and the flat slot to bootstrap from. The sum stops early
    when the successor is an episode's final observation (a truncation bootstraps from it with its discount
    ``gamma``, a termination from nothing) or the row's newest slot (its own reward's successor is not
    stored yet)."""
    capacity, num_rows = last.shape
    for i in range(flat.size):
        s, r = flat[i] // num_rows, flat[i] % num_rows
        pos = (s - (ptr[r] - count[r])) % capacity  # logical position, 0 = the row's oldest slot
        g, d, k = 0.0, 1.0, 0
        while True:
            slot = (s + k) % capacity
            g += d * rewards[slot, r]
            d *= discounts[slot, r]
            k += 1
            if k == n or pos + k >= count[r] - 1 or last[(s + k) % capacity, r]:
                break
        returns[i], discount[i], steps[i] = g, d, k
        next_flat[i] = ((s + k) % capacity) * num_rows + r


@njit(cache=True)
def importance_weights(sums: np.ndarray, mins: np.ndarray, flat: np.ndarray, beta: float, out: np.ndarray) -> None:
    """``(N * P(i)) ** -beta`` normalized by its largest value over the whole buffer, the one of the lowest
    priority: ``(p_i / p_min) ** -beta``, in (0, 1]."""
    size = sums.size // 2
    lowest = mins[1]
    for i in range(flat.size):
        out[i] = (sums[size + flat[i]] / lowest) ** -beta


@njit(cache=True)
def set_priorities(sums: np.ndarray, mins: np.ndarray, where: np.ndarray, stamps: np.ndarray, flat: np.ndarray,
                   sampled_stamps: np.ndarray, values: np.ndarray) -> int:
    """Set the leaves of the sampled starts that still hold the transition that was sampled (same stamp, still
    a start); returns how many were skipped because the slot was overwritten since."""
    skipped = 0
    for i in range(flat.size):
        f = flat[i]
        if stamps[f] == sampled_stamps[i] and where[f] >= 0:
            tree_set(sums, mins, f, values[i])
        else:
            skipped += 1
    return skipped


@njit(cache=True)
def stack_frames(flat: np.ndarray, k: int, ptr: np.ndarray, count: np.ndarray, last: np.ndarray,
                 out: np.ndarray) -> None:
    """The ``k`` flat slots whose observations make the frame stack of slot ``flat[i]``, oldest first, into
    ``out[i, :]`` (``out[i, k - 1] == flat[i]``). Walking back stops at an episode's first observation (its
    predecessor is an episode's final observation) or at the row's oldest held slot; the remaining places
    repeat the frame it stopped at, so a stack never holds a frame of another episode."""
    capacity, num_rows = last.shape
    for i in range(flat.size):
        s, r = flat[i] // num_rows, flat[i] % num_rows
        pos = (s - (ptr[r] - count[r])) % capacity
        out[i, k - 1] = flat[i]
        for j in range(k - 2, -1, -1):
            if pos > 0 and not last[(s - 1) % capacity, r]:
                s = (s - 1) % capacity
                pos -= 1
            out[i, j] = s * num_rows + r


@njit(cache=True)
def sequences(flat: np.ndarray, length: int, ptr: np.ndarray, count: np.ndarray, last: np.ndarray,
              rewards: np.ndarray, discounts: np.ndarray, observation_flat: np.ndarray, step_flat: np.ndarray,
              sequence_rewards: np.ndarray, sequence_discounts: np.ndarray, masks: np.ndarray) -> None:
    """For each start ``flat[i]``: ``length`` steps from it, within its episode. Step t is real
    (``masks[i, t]``) while slot ``start + t`` is a step (not a final observation) whose successor is held and
    every step before it was real; ``observation_flat[i, t + 1]`` is then its successor. Past the last real
    step, observations and steps repeat the last real ones, rewards and discounts are 0."""
    capacity, num_rows = last.shape
    for i in range(flat.size):
        s, r = flat[i] // num_rows, flat[i] % num_rows
        pos = (s - (ptr[r] - count[r])) % capacity
        observation_flat[i, 0] = flat[i]
        alive = True
        for t in range(length):
            slot = (s + t) % capacity
            alive = alive and not last[slot, r] and pos + t + 1 < count[r]
            masks[i, t] = alive
            if alive:
                step_flat[i, t] = slot * num_rows + r
                sequence_rewards[i, t] = rewards[slot, r]
                sequence_discounts[i, t] = discounts[slot, r]
                observation_flat[i, t + 1] = ((s + t + 1) % capacity) * num_rows + r
            else:
                step_flat[i, t] = step_flat[i, t - 1]  # t >= 1: a start's first step is always real
                sequence_rewards[i, t] = 0.0
                sequence_discounts[i, t] = 0.0
                observation_flat[i, t + 1] = observation_flat[i, t]

