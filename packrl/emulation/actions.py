"""Action layouts: a native action space offered to the policy as a flat discrete part plus a
flat continuous part, and handed back to the env in its own structure.

Discrete leaves become branches counted from 0 (``start`` is restored by ``decode``);
MultiDiscrete, MultiBinary and bounded integer or bool Boxes become one branch per element;
float Boxes become slices of the continuous part, returned in their own dtype and checked
against their own bounds. ``encode`` and ``decode`` are exact inverses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from packrl.emulation.layout import Layout
from packrl.emulation.tree import DictNode, LeafNode, fold, iter_leaves
from packrl.emulation.values import exact_array, format_path, outside_bounds, refuse_outside
from packrl.errors import EmulationError

try:
    from packrl.emulation import _fastaction
except ImportError:  # built without a C compiler: every action takes the checked Python path
    _fastaction = None


def _not_taken(spec: Any, action: Any) -> None:
    """What ``fast_decode`` is without the C extension: nothing is taken, the checked path decodes."""


fast_decode = _fastaction.decode if _fastaction is not None else _not_taken
"""``fast_decode(layout.spec, action)``: the native action of a policy action in the commonest forms
(int64 and float32/64 arrays, ints, a hybrid dict of two arrays) inside the space, else None."""

MAX_BRANCH = 2**24
"""Largest number of choices of one discrete branch (an integer Box wider than this is refused)."""


@dataclass(frozen=True)
class DiscretePart:
    path: tuple
    shape: tuple  # () for Discrete
    dtype: np.dtype
    start: np.ndarray  # per element, the native value of choice 0
    nvec: np.ndarray  # per element, the number of choices
    first: int  # index of the first branch in the discrete part
    leaf_id: int = 0  # the field's index in ``layout.leaves``


@dataclass(frozen=True)
class ContinuousPart:
    path: tuple
    shape: tuple
    dtype: np.dtype
    low: np.ndarray
    high: np.ndarray
    first: int
    leaf_id: int = 0  # the field's index in ``layout.leaves``


def outside_choices(choices: Any, nvec: Any) -> Any:
    """Where a choice is not one of ``[0, n)``: packrl's one Discrete action check (elementwise, for
    arrays and ints alike). Its compiled twin is ``inside`` in ``_fastaction.c``."""
    return (choices < 0) | (choices >= nvec)


class ActionLayout:
    """How a native action space maps to the policy's ``(discrete, continuous)`` actions. Each field
    of each leaf (``layout.leaves``) is a part: an integer field a discrete branch per element, a
    float field a slice of the continuous part; ``decode`` gives the env each leaf's ``to_native``."""

    def __init__(self, space: spaces.Space):
        self.space = space
        self.layout = Layout.from_space(space)
        self.discrete_parts: list[DiscretePart] = []
        self.continuous_parts: list[ContinuousPart] = []
        for path, node in iter_leaves(self.layout.root):
            self._add_leaf(node, path)
        # every leaf's native value is its stored field (packrl's own numeric codecs): decoders hand the
        # fields over as they are, and the C decoder may do it; else each leaf's codec makes its native value
        self.stored_is_native = all(node.codec.stored_is_native() for _, node in iter_leaves(self.layout.root))
        self.nvec = np.concatenate([p.nvec.reshape(-1) for p in self.discrete_parts]).astype(np.int64) \
            if self.discrete_parts else np.zeros(0, np.int64)
        self.low = np.concatenate([p.low.reshape(-1) for p in self.continuous_parts]) if self.continuous_parts else np.zeros(0)
        self.high = np.concatenate([p.high.reshape(-1) for p in self.continuous_parts]) if self.continuous_parts else np.zeros(0)
        wide = any(p.dtype == np.float64 for p in self.continuous_parts)
        self.continuous_dtype = np.dtype(np.float64 if wide else np.float32)
        self.kind = self._kind()
        self.policy_space = self._policy_space()
        self.spec = self._compiled_spec()

    # ------------------------------------------------------------ structure

    def _add_leaf(self, node: LeafNode, path: tuple) -> None:
        for leaf_id in node.leaf_ids:
            leaf = self.layout.leaves[leaf_id]
            if leaf.bounds is None:  # strings, a user's unbounded field: a policy cannot emit them
                field = "" if leaf.field is None else f" (field {leaf.field!r} has no bounds)"
                raise EmulationError(f"action leaf {format_path(path)}: {node.codec.kind} action spaces are not supported"
                                     f"{field}; a policy emits bounded fields only: use Discrete, MultiDiscrete, "
                                     "MultiBinary or Box leaves, or a codec whose fields have bounds")
            self._add_field(leaf_id, path, leaf.dtype, leaf.bounds.low, leaf.bounds.high)

    def _add_field(self, leaf_id: int, path: tuple, dtype: np.dtype, low: Any, high: Any) -> None:
        first_d = sum(p.nvec.size for p in self.discrete_parts)
        first_c = sum(int(np.prod(p.shape)) for p in self.continuous_parts)
        shape = tuple(np.shape(low))
        if dtype.kind == "f":
            self.continuous_parts.append(ContinuousPart(path, shape, dtype, np.asarray(low, np.float64),
                                                        np.asarray(high, np.float64), first_c, leaf_id))
            return
        low, high = np.asarray(low).astype(object), np.asarray(high).astype(object)
        n = np.asarray(high - low + 1)
        if n.size and max(n.reshape(-1)) > MAX_BRANCH:
            raise EmulationError(
                f"action leaf {format_path(path)}: integer Box with {max(n.reshape(-1))} choices per element "
                f"cannot be a discrete branch (at most {MAX_BRANCH}); narrow its bounds")
        start = low if dtype.kind == "u" else low.astype(np.int64)  # a uint64 start may not fit int64
        self.discrete_parts.append(DiscretePart(path, shape, dtype, np.asarray(start), np.asarray(n).astype(np.int64),
                                                first_d, leaf_id))

    def _kind(self) -> str:
        if isinstance(self.space, spaces.Discrete):
            return "discrete"
        if self.discrete_parts and self.continuous_parts:
            return "hybrid"
        if self.continuous_parts:
            return "continuous"
        return "multidiscrete"

    def _policy_space(self) -> spaces.Space:
        if self.kind == "discrete":
            return spaces.Discrete(int(self.nvec[0]))
        if self.kind == "continuous" and isinstance(self.space, spaces.Box):
            return self.space
        disc = spaces.MultiDiscrete(self.nvec) if self.nvec.size else None
        cont = spaces.Box(self.low.astype(self.continuous_dtype), self.high.astype(self.continuous_dtype),
                          dtype=self.continuous_dtype) if self.continuous_parts else None
        if self.kind == "hybrid":
            return spaces.Dict({"discrete": disc, "continuous": cont})
        return disc if self.kind == "multidiscrete" else cont

    def _compiled_spec(self) -> Any:
        """The C decoder's description of this layout (``_fastaction.action_spec``); None without the
        extension or for a float16 Box leaf (those decode on the Python path)."""
        if _fastaction is None or not self.stored_is_native \
                or any(p.dtype.itemsize not in (4, 8) for p in self.continuous_parts):
            return None
        form = 2 if self.kind == "hybrid" else 1 if self.kind == "continuous" else 0
        if (form != 1 and not self.num_discrete) or (form != 0 and not self.num_continuous):
            return None  # a part made only of empty leaves (a Box of shape (0,)): the Python path decodes it
        start = [int(s) % 2**64 for p in self.discrete_parts for s in np.asarray(p.start).reshape(-1)]
        parts = {p.path: (True, p.shape == (), p.dtype, p.shape, p.first) for p in self.discrete_parts}
        parts.update({p.path: (False, False, p.dtype, p.shape, p.first) for p in self.continuous_parts})
        paths = list(parts)
        index = {path: i for i, path in enumerate(paths)}
        tree = _c_tree(self.layout.root, index)
        return _fastaction.action_spec(
            form, self.num_discrete, self.num_continuous, self.nvec.astype(np.int64).tobytes(),
            np.array(start, np.uint64).tobytes(), self.low.astype(np.float64).tobytes(),
            self.high.astype(np.float64).tobytes(), tuple(parts[p] for p in paths), tree)

    @property
    def num_discrete(self) -> int:
        return int(self.nvec.size)

    @property
    def num_continuous(self) -> int:
        return int(self.low.size)

    # ------------------------------------------------------------ encode / decode

    def encode(self, native: Any) -> Any:
        """Native action (checked against the space) -> the policy-facing action."""
        fields = self.layout.packer.views(self.layout.pack(native), ())  # one per entry of layout.leaves
        disc = np.zeros(self.num_discrete, np.int64)
        cont = np.zeros(self.num_continuous, self.continuous_dtype)
        for part in self.discrete_parts:  # a uint64 start beyond 2**63 does not fit int64: Python ints
            value = fields[part.leaf_id].astype(object if part.dtype.kind == "u" else np.int64)
            disc[part.first: part.first + part.nvec.size] = np.asarray(value - part.start).astype(np.int64).reshape(-1)
        for part in self.continuous_parts:
            value = fields[part.leaf_id]
            cont[part.first: part.first + value.size] = value.reshape(-1)
        return self._policy_form(disc, cont)

    def _policy_form(self, disc: np.ndarray, cont: np.ndarray) -> Any:
        if self.kind == "discrete":
            return disc[0]
        if self.kind == "hybrid":
            return {"discrete": disc, "continuous": cont}
        if self.kind == "continuous":
            return cont.reshape(self.policy_space.shape).astype(self.policy_space.dtype)
        return disc

    def decode(self, action: Any, who: str = "") -> Any:
        """Policy-facing action -> native action, with ``start`` restored and each leaf's own dtype.
        Out-of-range choices or out-of-bounds continuous values raise EmulationError (``who`` names
        the agent or env in the message). The commonest forms decode in C (``fast_decode``)."""
        native = fast_decode(self.spec, action)
        return native if native is not None else self.checked_decode(action, who)

    def checked_decode(self, action: Any, who: str = "") -> Any:
        """``decode`` on the Python path: converts what converts exactly, refuses the rest by name."""
        action = _host_arrays(action)
        if self.kind == "discrete" and isinstance(action, (int, np.integer)) and not isinstance(action, (bool, np.bool_)):
            return self._decode_choice(int(action), who)
        disc, cont = self._split(action, who)
        if self.check_batch(disc[None], cont[None]) < 0:
            fields: list = [None] * len(self.layout.leaves)
            for part in self.discrete_parts:
                fields[part.leaf_id] = self._native_part(part, disc)
            for p in self.continuous_parts:
                fields[p.leaf_id] = cont[p.first: p.first + int(np.prod(p.shape))].reshape(p.shape).astype(p.dtype)
            return self._native(fields)
        if self.kind == "discrete":
            self._decode_choice(int(disc[0]), who)
        for part in self.discrete_parts:  # name the first leaf outside
            choice = disc[part.first: part.first + part.nvec.size].reshape(part.shape)
            refuse_outside(outside_choices(choice, part.nvec.reshape(part.shape)), choice, part.path,
                           f"is not a valid choice in [0, n) with n={part.nvec.tolist()}{who}")
        for part in self.continuous_parts:
            value = cont[part.first: part.first + int(np.prod(part.shape))].reshape(part.shape)
            refuse_outside(outside_bounds(value, part.low, part.high), value, part.path,
                           f"is outside the Box bounds [{part.low.min()}, {part.high.max()}] or not a number{who}")
        raise AssertionError("check_batch refused an action no leaf refuses")  # pragma: no cover

    def _native(self, fields: list) -> Any:
        """The native action of the decoded fields (one per entry of ``layout.leaves``): the fields
        themselves in the space's structure, through each leaf's ``to_native`` where that differs."""
        structure = self.layout.unflatten(fields)
        return structure if self.stored_is_native else self.layout.to_native(structure)

    @staticmethod
    def _native_part(part: DiscretePart, disc: np.ndarray) -> Any:
        choice = disc[part.first: part.first + part.nvec.size].reshape(part.shape)
        native = choice.astype(object) + part.start.astype(object) if part.dtype.kind == "u" else choice + part.start
        native = np.asarray(native).astype(part.dtype)
        return native[()] if part.shape == () else native

    def _decode_choice(self, choice: int, who: str) -> Any:
        part = self.discrete_parts[0]
        n = int(part.nvec)
        if outside_choices(choice, n):
            raise EmulationError(f"action {choice}{who} is outside its Discrete({n}) choices [0, {n - 1}]")
        value = part.dtype.type(choice + int(part.start))
        return value if self.stored_is_native else self._native([value])

    def decode_batch(self, actions: Any, who: str = "") -> list:
        """Many policy actions at once (a leading rows axis; a hybrid layout takes a dict of two such
        arrays) -> one native action per row, each as ``decode`` gives it. ``who`` may hold ``{}``,
        filled with the row of a refused action. One C call for the commonest forms."""
        if self.spec is not None:
            disc, cont = self._batch_parts(actions)
            out = _fastaction.decode_rows(self.spec, disc, cont)
            if type(out) is list:
                return out
            if out is not None:  # row ``out`` is refused: the Python path says why
                self.checked_decode(_row(actions, out), who.format(out))
        return [self.decode(_row(actions, k), who.format(k)) for k in range(_num_rows(actions))]

    def decode_choices(self, choices: np.ndarray, who: str = "") -> list:
        """Many actions of a Discrete space at once: ``(k,)`` choices -> k native values."""
        return self.decode_batch(choices, who)

    def check_batch(self, disc: np.ndarray | None, cont: np.ndarray | None) -> int:
        """packrl's one action checker: the first row of a batch whose action is outside this layout's
        policy space (a choice outside ``[0, n)``, a value outside ``[low, high]`` or NaN), or -1.
        ``disc``: (rows, num_discrete) choices; ``cont``: (rows, num_continuous) values (None where
        the layout has no such part). One C call for int64 and float32/64 arrays."""
        if self.spec is not None:
            bad = _fastaction.check_rows(self.spec, disc, cont)
            if bad is not None:
                return bad
        rows = len(disc) if disc is not None else len(cont) if cont is not None else 0
        if not rows:  # no rows, or a layout without elements
            return -1
        bad = np.zeros(rows, bool)
        if self.num_discrete:
            bad |= outside_choices(np.reshape(disc, (rows, -1)), self.nvec).any(axis=1)
        if self.num_continuous:
            bad |= outside_bounds(np.reshape(cont, (rows, -1)), self.low, self.high).any(axis=1)
        hits = np.flatnonzero(bad)
        return int(hits[0]) if hits.size else -1

    def _batch_parts(self, actions: Any) -> tuple[Any, Any]:
        """(disc, cont) of a batch in this layout's policy form (None for a part it has not)."""
        if self.kind == "hybrid":
            return (actions.get("discrete"), actions.get("continuous")) if isinstance(actions, dict) else (None, None)
        return (None, actions) if self.kind == "continuous" else (actions, None)

    def _split(self, action: Any, who: str) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "hybrid":
            if not isinstance(action, dict) or set(action) != {"discrete", "continuous"}:
                raise EmulationError(f"hybrid action{who} must be a dict with 'discrete' and 'continuous' parts, got {action!r}")
            disc, cont = action["discrete"], action["continuous"]
        elif self.kind == "continuous":
            disc, cont = np.zeros(0, np.int64), action
        else:
            disc, cont = action, np.zeros(0)
        try:
            disc = exact_array(np.reshape(np.asarray(disc), -1) if np.size(disc) == self.num_discrete else disc,
                               np.dtype(np.int64), (self.num_discrete,), ("discrete",))
        except EmulationError as err:  # say whose action it was
            raise EmulationError(f"{err}{who}") from None
        cont = np.asarray(cont, dtype=None)
        if cont.dtype.kind != "f" and cont.size:
            raise EmulationError(f"continuous action{who} must be floats, got dtype {cont.dtype}")
        if cont.size != self.num_continuous:
            raise EmulationError(f"continuous action{who} has {cont.size} values, the space needs {self.num_continuous}")
        return disc, cont.reshape(-1).astype(np.float64)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "spec": None}  # a C capsule does not pickle: rebuilt on arrival

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.spec = self._compiled_spec()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActionLayout) and other.layout == self.layout

    def __hash__(self) -> int:
        return hash(self.layout)

    def __repr__(self) -> str:
        return f"ActionLayout({self.kind}, nvec={self.nvec.tolist()}, continuous={self.num_continuous}, native={self.space})"


def _host_arrays(action: Any) -> Any:
    """Torch tensors (a policy's output, on any device) as numpy arrays, inside a hybrid dict too."""
    if isinstance(action, dict):
        return {k: _host_arrays(v) for k, v in action.items()}
    if hasattr(action, "detach") and hasattr(action, "cpu"):
        return action.detach().cpu().numpy()
    return action


def _row(actions: Any, k: int) -> Any:
    """Row k of a batch (of each part of a hybrid batch)."""
    return {name: part[k] for name, part in actions.items()} if isinstance(actions, dict) else actions[k]


def _num_rows(actions: Any) -> int:
    return len(next(iter(actions.values()))) if isinstance(actions, dict) else len(actions)


def _c_tree(root: Any, index: dict) -> Any:
    """The structure as the C decoder builds it: a leaf's index, ``(keys, children)`` for a Dict,
    ``(None, children)`` for a Tuple."""
    return fold(root, lambda path, node, results: index[path] if type(node) is LeafNode
                else (tuple(node.keys), results) if type(node) is DictNode else (None, results))
