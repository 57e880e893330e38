"""Random multi-env step streams and brute-force references for the replay buffer tests.

Observation ids are unique integers, so a sample tells exactly which slots it read; the references are
plain Python lists and dicts rebuilt from the raw step stream, sharing no code with the buffer."""
import numpy as np
import pytest

GAMMA = 0.9


def stream(rng, steps, rows, p_end, p_mask):
    """``steps`` vector-env steps of ``rows`` rows: random rewards, terminations, truncations, masks."""
    events, next_id = [], rows
    obs = np.arange(rows)
    for _ in range(steps):
        term = rng.random(rows) < p_end / 2
        trunc = ~term & (rng.random(rows) < p_end / 2)
        masks = rng.random(rows) >= p_mask
        final = np.arange(next_id, next_id + rows)
        new_obs = np.arange(next_id + rows, next_id + 2 * rows)
        next_id += 2 * rows
        rewards = rng.normal(size=rows).astype(np.float32)
        events.append((obs.copy(), rewards, term, trunc, final, masks))
        obs = np.where(masks, new_obs, obs)
    return events


def add(buf, event):
    obs, rewards, term, trunc, final, masks = event
    buf.add(obs, obs, rewards, term, trunc, final, masks)


def reference_slots(events, rows, capacity):
    """Per row, its held slots oldest first: (obs, reward, discount, last, physical slot)."""
    slots = [[] for _ in range(rows)]
    writes = [0] * rows
    for obs, rewards, term, trunc, final, masks in events:
        for r in np.flatnonzero(masks):
            slots[r].append((obs[r], rewards[r], 0.0 if term[r] else GAMMA, False, writes[r] % capacity))
            writes[r] += 1
            if term[r] or trunc[r]:
                slots[r].append((final[r], 0.0, 0.0, True, writes[r] % capacity))
                writes[r] += 1
    return [s[-capacity:] for s in slots]


def reference_starts(slots, rows):
    """Flat ids (slot * rows + row) of the held slots that start a transition: a step with a held successor."""
    return {s[j][4] * rows + r for r, s in enumerate(slots) for j in range(len(s) - 1) if not s[j][3]}


def check_nstep(batch, slots, n, rows):
    """Every sampled transition against the per-row slot list: start, return, discount, successor, steps."""
    for i in range(len(batch.steps)):
        row_slots = slots[batch.rows[i]]
        start = [j for j, s in enumerate(row_slots) if s[0] == batch.observations[i]]
        assert len(start) == 1, "each observation is stored once"
        j = start[0]
        assert not row_slots[j][3] and j + 1 < len(row_slots), "a sample starts at a step with a successor"
        assert batch.indices[i] == row_slots[j][4] * rows + batch.rows[i]
        g, disc, k = 0.0, 1.0, 0
        while True:
            g += disc * row_slots[j + k][1]
            disc *= row_slots[j + k][2]
            k += 1
            nxt = j + k
            if k == n or nxt >= len(row_slots) - 1 or row_slots[nxt][3]:
                break
        assert batch.steps[i] == k
        assert batch.returns[i] == pytest.approx(g, rel=1e-5, abs=1e-5)
        assert batch.discounts[i] == pytest.approx(disc, rel=1e-6)
        assert batch.next_observations[i] == row_slots[j + k][0]
        assert batch.actions[i] == batch.observations[i]


class ReferencePriorities:
    """Proportional prioritized replay by brute force: a dict of raw priorities of the current starts."""

    def __init__(self, rows, capacity, alpha, eps):
        self.rows, self.capacity, self.alpha, self.eps = rows, capacity, alpha, eps
        self.windows = [[] for _ in range(rows)]  # per row: [physical slot, last] of held slots
        self.writes = [0] * rows
        self.priority = {}
        self.max_priority = 1.0

    def add(self, event):
        obs, rewards, term, trunc, final, masks = event
        for r in np.flatnonzero(masks):
            self._write(r, False)
        for r in np.flatnonzero(masks & (term | trunc)):
            self._write(r, True)

    def _write(self, r, last):
        phys = self.writes[r] % self.capacity
        self.writes[r] += 1
        self.priority.pop(phys * self.rows + r, None)
        window = self.windows[r]
        if window and not window[-1][1]:
            self.priority[window[-1][0] * self.rows + r] = self.max_priority
        window.append((phys, last))
        del window[:-self.capacity]

    def update(self, indices, priorities):
        for f, p in zip(indices, priorities):
            if f in self.priority:
                self.priority[int(f)] = p + self.eps
        self.max_priority = max(self.max_priority, max(p + self.eps for p in priorities))

    def probabilities(self):
        p = np.zeros(self.rows * self.capacity)
        for f, prio in self.priority.items():
            p[f] = prio ** self.alpha
        return p / p.sum()

    def sample(self, uniforms):
        """The stratified draw: mass (i + u_i) * total / n, then the first slot whose prefix sum exceeds it."""
        leaves = self.probabilities()
        cumsum = np.cumsum(leaves)
        n = len(uniforms)
        mass = (np.arange(n) + uniforms) * cumsum[-1] / n
        return np.searchsorted(cumsum, mass, side="right"), cumsum, mass

    def weights(self, indices, beta):
        p = self.probabilities()
        return (p[indices] / p[p > 0].min()) ** -beta
