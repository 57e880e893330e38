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

from packrl.emulation.layout import DictNode, Layout, LeafNode, TupleNode
from packrl.emulation.values import _any_outside, exact_array, format_path, refuse_outside
from packrl.errors import EmulationError


def _table_choice(action: Any, table: tuple) -> Any:
    """``table[c]`` for a Discrete action ``c`` given as an int64 array of one element, a Python int
    or an int64 NumPy scalar, with ``0 <= c < len(table)``; None for anything else (the checked
    decode takes it from there). The C extension's ``choice`` does the same in a tenth of the time."""
    cls = action.__class__
    if cls is np.ndarray:
        if action.dtype.kind != "i" or action.dtype.itemsize != 8 or not action.dtype.isnative or action.size != 1:
            return None
        c = action.item()
    elif cls is int or cls is np.int64 or cls is np.longlong:
        c = int(action)
    else:
        return None
    return table[c] if 0 <= c < len(table) else None


try:
    from packrl.emulation._fastpack import choice as table_choice
except ImportError:  # built without a C compiler
    table_choice = _table_choice

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


@dataclass(frozen=True)
class ContinuousPart:
    path: tuple
    shape: tuple
    dtype: np.dtype
    low: np.ndarray
    high: np.ndarray
    first: int


class ActionLayout:
    """How a native action space maps to the policy's ``(discrete, continuous)`` actions."""

    def __init__(self, space: spaces.Space):
        self.space = space
        self.layout = Layout.from_space(space)
        self.discrete_parts: list[DiscretePart] = []
        self.continuous_parts: list[ContinuousPart] = []
        self._collect(self.layout.root, ())
        self.nvec = np.concatenate([p.nvec.reshape(-1) for p in self.discrete_parts]).astype(np.int64) \
            if self.discrete_parts else np.zeros(0, np.int64)
        self.low = np.concatenate([p.low.reshape(-1) for p in self.continuous_parts]) if self.continuous_parts else np.zeros(0)
        self.high = np.concatenate([p.high.reshape(-1) for p in self.continuous_parts]) if self.continuous_parts else np.zeros(0)
        wide = any(p.dtype == np.float64 for p in self.continuous_parts)
        self.continuous_dtype = np.dtype(np.float64 if wide else np.float32)
        self.kind = self._kind()
        self.policy_space = self._policy_space()

    # ------------------------------------------------------------ structure

    def _collect(self, node: Any, path: tuple) -> None:
        if type(node) is DictNode:
            for k, c in zip(node.keys, node.children):
                self._collect(c, path + (k,))
        elif type(node) is TupleNode:
            for i, c in enumerate(node.children):
                self._collect(c, path + (i,))
        else:
            self._add_leaf(node, path)

    def _add_leaf(self, node: LeafNode, path: tuple) -> None:
        codec, space = node.codec, node.codec.space
        first_d = sum(p.nvec.size for p in self.discrete_parts)
        first_c = sum(int(np.prod(p.shape)) for p in self.continuous_parts)
        dtype = np.dtype(codec.fields[0].dtype)
        if codec.kind == "discrete":
            self.discrete_parts.append(DiscretePart(path, (), dtype, np.array(codec.start), np.array(codec.n), first_d))
        elif codec.kind == "multidiscrete":
            self.discrete_parts.append(DiscretePart(path, codec.shape, dtype, _exact_ints(codec.start, dtype),
                                                    codec.nvec.astype(np.int64), first_d))
        elif codec.kind == "multibinary":
            shape = codec.shape
            self.discrete_parts.append(DiscretePart(path, shape, dtype, np.zeros(shape, np.int64),
                                                    np.full(shape, 2, np.int64), first_d))
        elif codec.kind == "box" and dtype.kind in "biu":
            low, high = np.asarray(space.low).astype(object), np.asarray(space.high).astype(object)
            n = high - low + 1
            if n.size and max(n.reshape(-1)) > MAX_BRANCH:
                raise EmulationError(
                    f"action leaf {format_path(path)}: integer Box with {max(n.reshape(-1))} choices per element "
                    f"cannot be a discrete branch (at most {MAX_BRANCH}); narrow its bounds")
            self.discrete_parts.append(DiscretePart(path, codec.shape, dtype, _exact_ints(space.low, dtype),
                                                    n.astype(np.int64), first_d))
        elif codec.kind == "box":
            self.continuous_parts.append(ContinuousPart(path, codec.shape, dtype, np.asarray(space.low, dtype=np.float64),
                                                        np.asarray(space.high, dtype=np.float64), first_c))
        else:
            raise EmulationError(f"action leaf {format_path(path)}: {codec.kind} action spaces are not supported "
                                 "(a policy cannot emit them); use Discrete, MultiDiscrete, MultiBinary or Box leaves")

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

    @property
    def num_discrete(self) -> int:
        return int(self.nvec.size)

    @property
    def num_continuous(self) -> int:
        return int(self.low.size)

    # ------------------------------------------------------------ encode / decode

    def encode(self, native: Any) -> Any:
        """Native action (checked against the space) -> the policy-facing action."""
        row = self.layout.pack(native)
        leaves = self.layout.unpack(row)
        disc = np.zeros(self.num_discrete, np.int64)
        cont = np.zeros(self.num_continuous, self.continuous_dtype)
        for part in self.discrete_parts:
            value = _get(leaves, part.path)
            value = _exact_ints(value, part.dtype)
            disc[part.first: part.first + part.nvec.size] = np.asarray(value - part.start).astype(np.int64).reshape(-1)
        for part in self.continuous_parts:
            value = np.asarray(_get(leaves, part.path))
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
        the agent or env in the message)."""
        action = _host_arrays(action)
        if self.kind == "discrete" and isinstance(action, (int, np.integer)) and not isinstance(action, bool):
            return self._decode_choice(int(action), who)
        disc, cont = self._split(action, who)
        leaf_values: dict[tuple, Any] = {}
        for part in self.discrete_parts:
            choice = disc[part.first: part.first + part.nvec.size].reshape(part.shape)
            bad = (choice < 0) | (choice >= part.nvec)
            refuse_outside(bad, choice, part.path, f"is not a valid choice in [0, n) with n={part.nvec.tolist()}{who}")
            native = choice.astype(object) + part.start.astype(object) if part.dtype.kind == "u" else choice + part.start
            leaf_values[part.path] = np.asarray(native).astype(part.dtype)[()] if part.shape == () \
                else np.asarray(native).astype(part.dtype)
        for part in self.continuous_parts:
            size = int(np.prod(part.shape))
            value = cont[part.first: part.first + size].reshape(part.shape)
            with np.errstate(invalid="ignore"):
                bad = ~((value >= part.low) & (value <= part.high))
            refuse_outside(bad, value, part.path,
                           f"is outside the Box bounds [{part.low.min()}, {part.high.max()}] or not a number{who}")
            leaf_values[part.path] = value.astype(part.dtype)
        return _rebuild(self.layout.root, leaf_values, ())

    def _decode_choice(self, choice: int, who: str) -> Any:
        part = self.discrete_parts[0]
        n = int(part.nvec)
        if not 0 <= choice < n:
            raise EmulationError(f"action {choice} is not a valid choice in [0, {n}){who}")
        return part.dtype.type(choice + int(part.start))

    def decode_choices(self, choices: np.ndarray, who: str = "") -> list:
        """Many actions of a Discrete space at once: ``(k,)`` choices -> k native values.
        ``who`` may hold ``{}``, filled with the position of a bad choice."""
        part = self.discrete_parts[0]
        arr = exact_array(choices, np.dtype(np.int64), (len(choices),), ())
        if arr.size and _any_outside(arr, 0, int(part.nvec) - 1):  # one compiled pass
            bad = (arr < 0) | (arr >= int(part.nvec))
            k = int(np.flatnonzero(bad)[0])
            raise EmulationError(f"action {arr[k]} is not a valid choice in [0, {int(part.nvec)}){who.format(k)}")
        if int(part.start) == 0 and part.dtype == arr.dtype:
            return list(arr)  # the commonest case: the choices are the native values
        if part.dtype.kind == "u":  # a uint64 start may not fit int64
            return list((arr.astype(object) + int(part.start)).astype(part.dtype))
        return list((arr + int(part.start)).astype(part.dtype))

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


def _exact_ints(values: Any, dtype: np.dtype) -> np.ndarray:
    """Per-element native values of choice 0: int64, or Python ints for an unsigned leaf (a uint64
    start beyond 2**63 does not fit int64)."""
    arr = np.asarray(values)
    return arr.astype(object) if dtype.kind == "u" else arr.astype(np.int64)


def _get(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _rebuild(node: Any, values: dict, path: tuple) -> Any:
    if type(node) is DictNode:
        return {k: _rebuild(c, values, path + (k,)) for k, c in zip(node.keys, node.children)}
    if type(node) is TupleNode:
        return tuple(_rebuild(c, values, path + (i,)) for i, c in enumerate(node.children))
    return values[path]
