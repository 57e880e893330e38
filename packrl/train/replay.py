"""A replay buffer that stores each observation once, a discount instead of a done, and samples n-step
transitions, uniformly or by priority, onto the learner's device.

Each row (agent) is its own stream of slots, dm_env style: a slot holds the observation an action was
taken at, the action, the reward that followed, and the discount to the next slot (``gamma``, or 0 after a
termination). When an episode ends, the ended episode's final observation is written as one more slot
that starts no transition (``last``), so a truncation bootstraps from it with discount ``gamma`` and the
next episode's first observation is never used as the successor. No observation is stored twice:
the successor of slot i is slot i + 1.

Observations are stored as the env gives them (packed uint8 rows for structured spaces); ``sample(...,
device=)`` hands them back nativized (``packrl.nativize``) on the learner's device. The index work (which
slots start a transition, the n-step sums, the sum tree) is Numba, see ``replay_index`` and ``sumtree``;
``save``/``load`` are in ``replay_store``.

Pixels and recurrence: ``frame_stack=k`` keeps each frame once and builds the last k frames of a chosen leaf
when it samples (DrQ-v2's layout), never across an episode start; ``sample_sequences(batch, L)`` gives L
consecutive steps from drawn starts with masks that stop at the episode's end (R2D2-style recurrent
off-policy learning).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packrl.errors import UsageError
from packrl.nativize import leaf_views
from packrl.train import replay_index
from packrl.train.replay_store import load_buffer, save_buffer
from packrl.train.sumtree import new_trees

BLOCK_ALIGN = 64  # each array of a sample starts on a cache line of its block
BLOCK_POOL = 4  # recycled sample blocks kept per size


@dataclass
class NStepBatch:
    """One sample. ``returns`` = sum of discounted rewards over ``steps`` slots; the target is
    ``returns + discounts * V(next_observations)`` (``discounts`` is 0 after a termination, gamma**steps
    otherwise). ``weights``: importance weights of a prioritized sample (ones when uniform), to multiply the
    per-sample loss by. The observations, actions, returns, discounts and weights are numpy arrays, or torch
    tensors on the device asked for; ``steps``, ``rows``, ``indices`` (the flat slots the transitions start
    at) and ``stamps`` (which write of the slot was sampled) stay numpy, for ``update_priorities``."""

    observations: Any
    actions: Any
    returns: Any
    discounts: Any
    next_observations: Any
    weights: Any
    steps: np.ndarray
    rows: np.ndarray
    indices: np.ndarray
    stamps: np.ndarray


@dataclass
class SequenceBatch:
    """``batch_size`` sequences of ``L`` steps (``ReplayBuffer.sample_sequences``). ``observations``: ``(batch,
    L + 1, ...)``, place t + 1 the successor of step t; ``actions``, ``rewards``, ``discounts`` (gamma, or 0
    after a termination) and ``masks`` (step t is real): ``(batch, L, ...)``; ``weights``: importance weights
    per sequence (ones when uniform). ``rows``, ``indices`` (the flat slot each sequence starts at) and
    ``stamps`` stay numpy, for ``update_priorities``."""

    observations: Any
    actions: Any
    rewards: Any
    discounts: Any
    masks: Any
    weights: Any
    rows: np.ndarray
    indices: np.ndarray
    stamps: np.ndarray


class ReplayBuffer:
    """``capacity`` slots per row for ``num_rows`` rows (the vector env's agents).

    ``layout``: the observation Layout; samples then come back nativized (the leaves' own dtypes and shapes)
    instead of as rows, and ``observation_shape``/``dtype`` default to its packed rows. ``prioritized``:
    proportional prioritized replay (Schaul et al. 2016): P(i) = p_i**alpha / sum_j p_j**alpha, new
    transitions get the largest priority set so far, importance weights ``(N P(i))**-beta`` normalized by
    the buffer's largest one. ``ReplayBuffer.for_env(env, capacity)`` reads all shapes from a packrl env.

    ``frame_stack=k`` (DrQ-v2's layout): each frame is stored once, and a sample's ``frame_stack_leaf`` (a
    layout leaf: a top-level Dict key such as ``"image"``, a path tuple, or a leaf name such as
    ``"['image']"``; the whole observation when there is no layout) comes back as the last ``k`` frames,
    ``(batch, k, *leaf shape)``, oldest first. A stack never crosses an episode start: the places before
    an episode's first frame repeat that frame (and, where the ring has overwritten the start of an episode,
    the oldest frame still held). The other leaves are the current frame's."""

    def __init__(self, capacity: int, num_rows: int, observation_shape: tuple | None = None,
                 observation_dtype: Any = None, action_shape: tuple = (), action_dtype: Any = np.int64,
                 gamma: float = 0.99, seed: int | None = None, *, layout: Any = None, prioritized: bool = False,
                 alpha: float = 0.6, beta: float = 0.4, priority_eps: float = 1e-6, frame_stack: int = 1,
                 frame_stack_leaf: Any = None):
        capacity, num_rows = _count("capacity", capacity, 2), _count("num_rows", num_rows, 1)
        if observation_shape is None or observation_dtype is None:
            if layout is None:
                raise UsageError("ReplayBuffer needs observation_shape and observation_dtype, or a layout")
            observation_shape, observation_dtype = (layout.nbytes,), np.uint8
        if not 0.0 <= float(gamma) <= 1.0:
            raise UsageError(f"ReplayBuffer gamma must be in [0, 1], got {gamma}")
        for name, value in (("alpha", alpha), ("beta", beta)):
            if not 0.0 <= float(value) < math.inf:
                raise UsageError(f"ReplayBuffer {name} must be finite and >= 0, got {value}")
        if not float(priority_eps) > 0.0 or not math.isfinite(float(priority_eps)):
            raise UsageError(f"ReplayBuffer priority_eps must be finite and > 0, got {priority_eps}")
        self.frame_stack = _count("frame_stack", frame_stack, 1)
        if self.frame_stack > MAX_FRAME_STACK:
            raise UsageError(f"ReplayBuffer frame_stack={self.frame_stack} is more than {MAX_FRAME_STACK} frames")
        rows_are_layout = (layout is not None and tuple(observation_shape) == (layout.nbytes,)
                           and np.dtype(observation_dtype) == np.uint8)
        self.frame_stack_leaf, self._stacked = _stacked_leaf(layout if rows_are_layout else None, frame_stack_leaf,
                                                             self.frame_stack)
        self.capacity, self.num_rows, self.gamma = capacity, num_rows, float(gamma)
        self.layout = layout
        self.prioritized, self.alpha, self.beta, self.priority_eps = bool(prioritized), float(alpha), float(beta), float(priority_eps)
        self.max_priority = 1.0
        slots = capacity * num_rows
        self.observations = np.zeros((capacity, num_rows, *observation_shape), observation_dtype)
        self.actions = np.zeros((capacity, num_rows, *action_shape), action_dtype)
        self.rewards = np.zeros((capacity, num_rows), np.float32)
        self.discounts = np.zeros((capacity, num_rows), np.float32)
        self.last = np.zeros((capacity, num_rows), bool)
        self.ptr = np.zeros(num_rows, np.int64)  # next physical slot to write, per row
        self.count = np.zeros(num_rows, np.int64)  # slots held, per row
        self.starts = np.zeros(slots, np.int64)  # starts[:held] are the flat slots that start a transition
        self.where = np.full(slots, -1, np.int64)  # position of a flat slot in starts, or -1
        self.held = np.zeros(1, np.int64)
        if self.prioritized:
            self.sums, self.mins = new_trees(slots)
            self.stamps, self.clock = np.zeros(slots, np.int64), np.zeros(1, np.int64)
        else:
            self.sums, self.mins = np.zeros(0), np.zeros(0)
            self.stamps, self.clock = np.zeros(0, np.int64), np.zeros(1, np.int64)
        self.rng = np.random.default_rng(seed)
        self._staging: dict = {}
        self._blocks: dict = {}
        self._plans: dict = {}

    @classmethod
    def for_env(cls, env: Any, capacity: int, **kwargs: Any) -> "ReplayBuffer":
        """A buffer shaped for a packrl env or vector env: its rows (``num_agents``), its observation rows
        and Layout, its policy-facing action."""
        obs_space, act_space = env.single_observation_space, env.single_action_space
        layout = getattr(getattr(env, "emulated", None), "observation", None)
        rows = getattr(env, "num_agents", None) or getattr(env, "num_envs", 1)
        return cls(capacity, rows, tuple(obs_space.shape), obs_space.dtype, tuple(act_space.shape or ()),
                   act_space.dtype, layout=layout, **kwargs)

    def __len__(self) -> int:
        """Slots held (steps and final observations)."""
        return int(self.count.sum())

    @property
    def transitions(self) -> int:
        """Slots that start a transition now: what ``sample`` draws from."""
        return int(self.held[0])

    @property
    def nbytes(self) -> int:
        """Bytes of every array the buffer holds (storage, index, trees)."""
        arrays = (self.observations, self.actions, self.rewards, self.discounts, self.last, self.ptr, self.count,
                  self.starts, self.where, self.held, self.sums, self.mins, self.stamps, self.clock)
        return sum(a.nbytes for a in arrays)

    # ------------------------------------------------------------ writing

    def add(self, observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminals: np.ndarray,
            truncations: np.ndarray, final_observations: np.ndarray, masks: np.ndarray | None = None) -> None:
        """One vector-env step: ``observations`` the actions were taken at, then what the step returned
        (``final_observations`` is read only at rows whose episode ended). Observations must be the stored
        dtype and actions must cast to it without loss; rewards are stored as float32. Masked rows (absent
        agents) write nothing.

        Autoreset modes: SAME_STEP (packrl's default) as above. NEXT_STEP: pass the step's returned
        observations as ``final_observations``, and ``masks=~ended`` where ``ended`` is the previous step's
        ``terminals | truncations``, so the reset step (its action ignored, reward 0) writes nothing (a packrl
        vector env gives them: ``np.repeat(env.ended_envs, env.agents_per_env)`` read before the step).
        DISABLED: the step's returned observations as ``final_observations``; the next ``add`` starts from
        the reset observation. All three store the same slots, from gymnasium's SyncVectorEnv and from
        ``packrl.vector.make(..., autoreset_mode=...)`` (``tests/test_replay_autoreset.py``)."""
        observations = self._checked_observations("observations", observations)
        actions = np.asarray(actions)
        if actions.shape != (self.num_rows, *self.actions.shape[2:]) or not np.can_cast(actions.dtype, self.actions.dtype, "safe"):
            raise UsageError(f"ReplayBuffer.add: actions must be {self.actions.dtype} {(self.num_rows, *self.actions.shape[2:])}, "
                             f"got {actions.dtype} {actions.shape}")
        rewards, terminals, truncations = (self._checked_flags(name, value, dtype) for name, value, dtype in
                                           (("rewards", rewards, np.float32), ("terminals", terminals, bool),
                                            ("truncations", truncations, bool)))
        rows = np.arange(self.num_rows) if masks is None else np.flatnonzero(self._checked_flags("masks", masks, bool))
        self._write(rows, False, observations[rows], actions[rows], rewards[rows],
                    np.where(terminals[rows], 0.0, self.gamma))
        done = rows[(terminals | truncations)[rows]]
        if done.size:
            finals = self._checked_observations("final_observations", final_observations)
            self._write(done, True, finals[done], 0, 0.0, 0.0)

    def _write(self, rows: np.ndarray, is_last: bool, obs: np.ndarray, actions: Any, rewards: Any, discounts: Any) -> None:
        slots = np.empty(rows.size, np.int64)
        new_priority = self.max_priority ** self.alpha
        replay_index.advance(rows, is_last, self.ptr, self.count, self.last, self.starts, self.where, self.held,
                             self.sums, self.mins, new_priority, self.stamps, self.clock, slots)
        self.observations[slots, rows] = obs
        self.actions[slots, rows] = actions
        self.rewards[slots, rows] = rewards
        self.discounts[slots, rows] = discounts

    def _checked_observations(self, name: str, value: Any) -> np.ndarray:
        value = np.asarray(value)
        want = (self.num_rows, *self.observations.shape[2:])
        if value.shape != want or value.dtype != self.observations.dtype:
            raise UsageError(f"ReplayBuffer.add: {name} must be {self.observations.dtype} {want} (stored as they are, "
                             f"never cast), got {value.dtype} {value.shape}")
        return value

    def _checked_flags(self, name: str, value: Any, dtype: Any) -> np.ndarray:
        value = np.asarray(value)
        if value.shape != (self.num_rows,):
            raise UsageError(f"ReplayBuffer.add: {name} must have shape ({self.num_rows},), got {value.shape}")
        if dtype is bool and value.dtype != bool:
            raise UsageError(f"ReplayBuffer.add: {name} must be bool, got {value.dtype}")
        if dtype is not bool and value.dtype.kind not in "fiu":
            raise UsageError(f"ReplayBuffer.add: {name} must be real numbers, got {value.dtype}")
        return value

    # ------------------------------------------------------------ sampling

    def sample(self, batch_size: int, n: int = 1, device: Any = None, beta: float | None = None) -> NStepBatch:
        """``batch_size`` n-step transitions: uniform over the slots that start one, or by priority. n-step
        returns stop early at an episode's final observation or at the newest slot of the row.
        ``device``: None gives numpy arrays; a torch device gives tensors there (nativized observations when
        the buffer has a layout): zero-copy views of the gathered rows on CPU, pinned host buffers and
        non-blocking copies on CUDA. ``beta`` overrides the buffer's for this sample (to anneal it)."""
        batch_size, n = _count("batch_size", batch_size, 1), _count("n", n, 1)
        held = int(self.held[0])
        if held == 0:
            raise UsageError("the replay buffer holds no transition yet (a row needs a step and its successor)")
        flat, rows = np.empty(batch_size, np.int64), np.empty(batch_size, np.int64)
        replay_index.draw(self.rng.random(batch_size), self.starts, held, self.sums, flat, rows, self.num_rows)
        if device is not None:
            device = torch.device(device)
        host = self._host_buffers(batch_size, device is not None and device.type == "cuda")
        steps, next_flat = np.empty(batch_size, np.int64), np.empty(batch_size, np.int64)
        replay_index.nstep(flat, n, self.ptr, self.count, self.last, self.rewards, self.discounts,
                           host["returns"], host["discounts"], steps, next_flat)
        if self.prioritized:
            replay_index.importance_weights(self.sums, self.mins, flat, self.beta if beta is None else float(beta),
                                            host["weights"])
        else:
            host["weights"].fill(1.0)
        # mode="clip": the indices come from the index and are in range; "raise" would copy through a temporary
        stored_observations, stored_actions = self._flat_views()
        stored_observations.take(flat, axis=0, out=host["observations"], mode="clip")
        stored_observations.take(next_flat, axis=0, out=host["next_observations"], mode="clip")
        stored_actions.take(flat, axis=0, out=host["actions"], mode="clip")
        if self.frame_stack > 1:
            self._gather_stacks(flat, host["stacks"])
            self._gather_stacks(next_flat, host["next_stacks"])
        stamps = self.stamps[flat] if self.prioritized else np.zeros(batch_size, np.int64)
        if device is None:
            out, wrap = host, None
        elif device.type == "cpu":
            out, wrap = {name: torch.from_numpy(a) for name, a in host.items()}, torch.from_numpy
        else:
            out, wrap = self._to_device(host, device), None
        source = host if device is not None and device.type == "cpu" else out  # CPU: views made in numpy, then wrapped
        observations = self._observations(source["observations"], source.get("stacks"), wrap)
        next_observations = self._observations(source["next_observations"], source.get("next_stacks"), wrap)
        return NStepBatch(observations, out["actions"], out["returns"], out["discounts"], next_observations,
                          out["weights"], steps, rows, flat, stamps)

    def sample_sequences(self, batch_size: int, sequence_length: int, device: Any = None,
                         beta: float | None = None) -> SequenceBatch:
        """``batch_size`` sequences of ``sequence_length`` steps for recurrent off-policy learning (R2D2-style),
        each starting at a slot drawn as ``sample`` draws transitions (uniform, or by priority with importance
        weights). A sequence never crosses an episode end or the row's newest slot: ``masks[:, t]`` says step
        t is real; past the last real step, observations and actions repeat the last real ones and rewards and
        discounts are 0. ``observations`` has ``sequence_length + 1`` places: place t + 1 is the successor of
        step t (the ended episode's final observation after its last step). Frame stacks, when the buffer
        has them, are built for every place."""
        batch_size, length = _count("batch_size", batch_size, 1), _count("sequence_length", sequence_length, 1)
        if length > self.capacity:  # no real step could fill it: all masks past the buffer, memory for nothing
            raise UsageError(f"ReplayBuffer.sample_sequences: sequence_length {length:,} is longer than the buffer "
                             f"({self.capacity:,} slots per row)")
        held = int(self.held[0])
        if held == 0:
            raise UsageError("the replay buffer holds no transition yet (a row needs a step and its successor)")
        flat, rows = np.empty(batch_size, np.int64), np.empty(batch_size, np.int64)
        replay_index.draw(self.rng.random(batch_size), self.starts, held, self.sums, flat, rows, self.num_rows)
        observation_flat = np.empty((batch_size, length + 1), np.int64)
        step_flat = np.empty((batch_size, length), np.int64)
        host = {"rewards": np.empty((batch_size, length), np.float32),
                "discounts": np.empty((batch_size, length), np.float32),
                "masks": np.empty((batch_size, length), bool),
                "weights": np.ones(batch_size, np.float32)}
        replay_index.sequences(flat, length, self.ptr, self.count, self.last, self.rewards, self.discounts,
                               observation_flat, step_flat, host["rewards"], host["discounts"], host["masks"])
        if self.prioritized:
            replay_index.importance_weights(self.sums, self.mins, flat, self.beta if beta is None else float(beta),
                                            host["weights"])
        stored_observations, stored_actions = self._flat_views()
        host["observations"] = stored_observations[observation_flat]
        host["actions"] = stored_actions[step_flat]
        if self.frame_stack > 1:
            item, dtype = self._stack_item()
            host["stacks"] = np.empty((batch_size, length + 1, *item), dtype)
            self._gather_stacks(observation_flat.ravel(), host["stacks"].reshape(-1, *item))
        stamps = self.stamps[flat] if self.prioritized else np.zeros(batch_size, np.int64)
        if device is None:
            out = host
        else:
            out = {name: torch.from_numpy(a).to(torch.device(device)) for name, a in host.items()}
        observations = self._observations(out["observations"], out.get("stacks"))
        return SequenceBatch(observations, out["actions"], out["rewards"], out["discounts"], out["masks"],
                             out["weights"], rows, flat, stamps)

    def stack_indices(self, flat: np.ndarray) -> np.ndarray:
        """The flat slots (``slot * num_rows + row``) of the frame stack of each flat slot in ``flat``:
        ``(*flat.shape, frame_stack)``, oldest first."""
        flat = np.ascontiguousarray(flat, np.int64)
        out = np.empty((flat.size, self.frame_stack), np.int64)
        replay_index.stack_frames(flat.ravel(), self.frame_stack, self.ptr, self.count, self.last, out)
        return out.reshape(*flat.shape, self.frame_stack)

    def _stack_item(self) -> tuple[tuple, np.dtype]:
        """Shape and dtype of one stored frame of the stacked part: the leaf's bytes, or the whole observation."""
        if self._stacked is None:
            return (self.frame_stack, *self.observations.shape[2:]), self.observations.dtype
        return (self.frame_stack, self.layout.leaves[self._stacked].nbytes), np.dtype(np.uint8)

    def _gather_stacks(self, flat: np.ndarray, out: np.ndarray) -> None:
        """The stacked part of each slot's frames into ``out`` ``(len(flat), k, ...)``."""
        frames = self.stack_indices(flat).ravel()
        stored, out = self._flat_views()[0], out.reshape(frames.size, *out.shape[2:])
        if self._stacked is None:
            stored.take(frames, axis=0, out=out, mode="clip")
        else:
            leaf = self.layout.leaves[self._stacked]
            # fancy indexing with a trailing slice copies each row's leaf bytes; np.take of the column slice
            # would first copy the whole storage contiguous (600 ms against 2 ms for an 800 MB buffer)
            out[...] = stored[frames, leaf.offset: leaf.offset + leaf.nbytes]

    def _observations(self, rows: Any, stacks: Any, wrap: Any = None) -> Any:
        """Sampled rows (numpy or torch) -> what a batch hands back: nativized leaves when the buffer has a
        layout (``_stacked`` set or not None), with the stacked leaf (or the whole observation) replaced by
        its frame stack; each result passed through ``wrap`` when given."""
        wrap = wrap or (lambda value: value)
        if self._stacked is None and (self.layout is None or rows.shape[-1:] != (self.layout.nbytes,)
                                      or str(rows.dtype) not in ("uint8", "torch.uint8")):
            return wrap(rows if stacks is None else stacks)  # no layout, or a Box stored as its own rows
        if isinstance(rows, np.ndarray):
            leaves = self._leaf_views(rows)
        else:
            leaves = leaf_views(rows, self.layout)
        if stacks is not None:
            leaf = self.layout.leaves[self._stacked]
            typed = stacks.view(leaf.dtype) if isinstance(stacks, np.ndarray) else stacks.view(_torch_dtype(leaf.dtype))
            leaves[self._stacked] = typed.reshape(*stacks.shape[:-1], *leaf.shape)
        return self.layout.unflatten([wrap(leaf) for leaf in leaves])

    def _flat_views(self) -> tuple[np.ndarray, np.ndarray]:
        """Observations and actions with (slot, row) as one flat axis (views: the storage is C-contiguous)."""
        slots = self.capacity * self.num_rows
        return (self.observations.reshape(slots, *self.observations.shape[2:]),
                self.actions.reshape(slots, *self.actions.shape[2:]))

    def _leaf_views(self, rows: np.ndarray) -> list:
        """Host rows -> one zero-copy numpy view per leaf: what ``nativize`` gives. On CPU the views are made
        in numpy and each wrapped by ``torch.from_numpy`` after (see ``sample``): 3-4x faster than nativize's
        three torch ops per leaf (about 35 against 120 µs for ten leaves), and it avoids ``layout.unpack``,
        whose cache of the last rows' views would pin the sample's block."""
        batch = rows.shape[:-1]
        return [rows[..., leaf.offset: leaf.offset + leaf.nbytes].view(leaf.dtype).reshape(batch + tuple(leaf.shape))
                for leaf in self.layout.leaves]

    def _host_buffers(self, batch_size: int, cuda: bool) -> dict:
        """Host arrays for one sample: views into one recycled block (numpy, or CPU tensors' own memory), or,
        for CUDA, the next of two pinned sets."""
        plan = self._plans.get(batch_size)
        if plan is None:
            plan = self._plans[batch_size] = self._plan(batch_size)
        shapes, offsets, total = plan
        if cuda:
            return self._pinned(batch_size, shapes)
        block = self._free_block(total)
        return {name: np.ndarray(shape, dtype, buffer=block, offset=start)
                for (name, (shape, dtype)), (start, _) in zip(shapes.items(), offsets)}

    def _plan(self, batch_size: int) -> tuple[dict, list, int]:
        """The arrays of a sample of ``batch_size``, and where each lies in its block."""
        row = (batch_size, *self.observations.shape[2:])
        shapes = {"observations": (row, self.observations.dtype), "next_observations": (row, self.observations.dtype),
                  "actions": ((batch_size, *self.actions.shape[2:]), self.actions.dtype),
                  "returns": ((batch_size,), np.dtype(np.float32)), "discounts": ((batch_size,), np.dtype(np.float32)),
                  "weights": ((batch_size,), np.dtype(np.float32))}
        if self.frame_stack > 1:
            item, dtype = self._stack_item()
            shapes["stacks"] = shapes["next_stacks"] = ((batch_size, *item), dtype)
        offsets, end = [], 0
        for shape, dtype in shapes.values():
            size = math.prod(shape) * dtype.itemsize
            offsets.append((end, end + size))
            end += -(-size // BLOCK_ALIGN) * BLOCK_ALIGN
        return shapes, offsets, end

    def _free_block(self, nbytes: int) -> np.ndarray:
        """A block of ``nbytes`` that nothing references any more (no batch, array, view or tensor made from
        it is alive: each of those holds a reference to it), else a new one, kept for later if the pool has
        room. Reusing mapped memory matters: a fresh multi-megabyte allocation page-faults on every call (a
        sample of 256 rows of 11 KB is 2 x 2.8 MB)."""
        pool = self._blocks.setdefault(nbytes, [])
        for i in range(len(pool)):
            if sys.getrefcount(pool[i]) == UNREFERENCED:
                return pool[i]
        block = np.empty(nbytes, np.uint8)
        if len(pool) < BLOCK_POOL:
            pool.append(block)
        return block

    def _pinned(self, batch_size: int, shapes: dict) -> dict:
        """Two sets of pinned host buffers per batch size, used in turn. Each set's CUDA event is recorded
        after its copies are queued, and waited on before the set is written again, so a buffer is never
        overwritten while its non-blocking copy may still read it."""
        sets = self._staging.setdefault(batch_size, {"turn": 0, "sets": [None, None]})
        turn = sets["turn"]
        sets["turn"] ^= 1
        if sets["sets"][turn] is None:
            tensors = {name: torch.empty(shape, dtype=_torch_dtype(dtype), pin_memory=True)
                       for name, (shape, dtype) in shapes.items()}
            sets["sets"][turn] = (tensors, torch.cuda.Event())
        tensors, event = sets["sets"][turn]
        event.synchronize()
        self._pending = (tensors, event)
        return {name: t.numpy() for name, t in tensors.items()}

    def _to_device(self, host: dict, device: Any) -> dict:
        if device.type != "cuda":
            return {name: torch.from_numpy(a).to(device) for name, a in host.items()}
        pinned, event = self._pending  # the pinned tensors themselves, which torch knows are page-locked
        out = {name: pinned[name].to(device, non_blocking=True) for name in host}
        event.record()
        return out

    # ------------------------------------------------------------ priorities

    def update_priorities(self, batch: NStepBatch, priorities: Any) -> int:
        """New priorities (for example |TD error|) for the transitions of ``batch``. A slot overwritten since
        it was sampled keeps its priority (the batch's transition is gone); returns how many were skipped."""
        if not self.prioritized:
            raise UsageError("update_priorities needs a buffer made with prioritized=True")
        if hasattr(priorities, "detach"):
            priorities = priorities.detach().cpu().numpy()
        priorities = np.asarray(priorities, np.float64)
        if priorities.shape != batch.indices.shape:
            raise UsageError(f"update_priorities: priorities must have shape {batch.indices.shape} (one per sampled "
                             f"transition), got {priorities.shape}")
        if not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
            bad = int(np.flatnonzero(~np.isfinite(priorities) | (priorities < 0))[0])
            raise UsageError(f"update_priorities: priorities must be finite and >= 0; sample {bad} has {priorities[bad]}")
        priorities = priorities + self.priority_eps
        self.max_priority = max(self.max_priority, float(priorities.max(initial=0.0)))
        return int(replay_index.set_priorities(self.sums, self.mins, self.where, self.stamps, batch.indices,
                                               batch.stamps, priorities ** self.alpha))

    def probabilities(self) -> np.ndarray:
        """P(flat slot) for every slot, shape ``(capacity, num_rows)`` (0 where no transition starts)."""
        slots = self.capacity * self.num_rows
        if self.prioritized:
            leaves = self.sums[self.sums.size // 2:][:slots]
            p = leaves / self.sums[1] if self.sums[1] > 0 else np.zeros(slots)
        else:
            p = np.zeros(slots)
            p[self.starts[:self.transitions]] = 1.0 / max(self.transitions, 1)
        return p.reshape(self.capacity, self.num_rows)

    # ------------------------------------------------------------ files

    def save(self, path: str | Path) -> Path:
        """Write the buffer into the folder ``path`` (safetensors arrays + JSON metadata with their SHA-256,
        no pickle): ``load`` gives a buffer that samples exactly what this one would, RNG state included."""
        return save_buffer(self, path)

    @classmethod
    def load(cls, path: str | Path) -> "ReplayBuffer":
        """The buffer saved in ``path``; the SHA-256 is checked before any array is read
        (``packrl.checkpoint.CheckpointError`` on a mismatch or a malformed file)."""
        return load_buffer(cls, path)


def _unreferenced() -> int:
    """What ``sys.getrefcount(pool[i])`` reads for an array that only its pool holds (2 on CPython 3.10-3.13:
    the list's reference and the argument's), measured the same way, not assumed, for interpreters that
    count differently."""
    pool, i = [np.empty(0, np.uint8)], 0
    return sys.getrefcount(pool[i])


UNREFERENCED = _unreferenced()


MAX_FRAME_STACK = 1024
"""The most frames a stack may hold (DrQ-v2 stacks 3, Atari agents 4): each sample allocates batch x frame_stack
copies of the stacked leaf, so a larger value is an error, not a request."""


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise UsageError(f"ReplayBuffer {name} must be an int >= {least}, got {value!r}")
    return int(value)


def _stacked_leaf(layout: Any, spec: Any, frame_stack: int) -> tuple[str | None, int | None]:
    """``frame_stack_leaf`` -> (the leaf's name, its index in ``layout.leaves``); (None, None) stacks the whole
    observation (no layout) or nothing (``frame_stack == 1`` and no leaf named)."""
    if layout is None:
        if spec is not None:
            raise UsageError(f"ReplayBuffer frame_stack_leaf={spec!r} needs observations stored as a layout's rows "
                             "(without them the whole observation is stacked: leave it None)")
        return None, None
    if spec is None:
        if frame_stack == 1:
            return None, None
        if len(layout.leaves) != 1:
            raise UsageError(f"ReplayBuffer frame_stack_leaf must name the leaf to stack, one of "
                             f"{[leaf.name for leaf in layout.leaves]}")
        return layout.leaves[0].name, 0
    for i, leaf in enumerate(layout.leaves):
        if spec == leaf.name or (isinstance(spec, tuple) and spec == leaf.path and leaf.field is None) or (
                isinstance(spec, (str, int)) and (spec,) == leaf.path and leaf.field is None):
            return leaf.name, i
    raise UsageError(f"ReplayBuffer frame_stack_leaf={spec!r} is not a leaf of the layout; its leaves are "
                     f"{[leaf.name for leaf in layout.leaves]}")


def _torch_dtype(dtype: Any) -> Any:
    return torch.from_numpy(np.empty(0, dtype)).dtype
