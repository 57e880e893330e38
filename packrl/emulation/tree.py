"""The tree of a Layout: its node types and the one walk over them (as JAX's ``tree_util``).

A space's structure is a tree of ``DictNode`` and ``TupleNode`` with a ``LeafNode`` (a codec
and the ids of its fields in ``Layout.leaves``) at each leaf. Everything that walks the
structure goes through ``build``, ``fold`` (``map_leaves``, ``iter_nodes`` and ``iter_leaves``
are folds), ``flatten`` and ``unflatten``. Paths are tuples of Dict keys and Tuple indices from
the root (``()`` is the root itself).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from packrl.emulation.values import format_path
from packrl.errors import EmulationError


@dataclass(frozen=True)
class LeafNode:
    """A leaf: its codec and the ids of the codec's fields in ``Layout.leaves``."""

    codec: Any
    leaf_ids: tuple[int, ...]


@dataclass(frozen=True)
class DictNode:
    keys: tuple
    children: tuple
    keyset: frozenset = field(init=False, repr=False, compare=False)
    # a Dict of two or more leaves: flatten reads its values in one C call
    getter: Callable | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keyset", frozenset(self.keys))
        flat = len(self.keys) > 1 and all(type(c) is LeafNode for c in self.children)
        object.__setattr__(self, "getter", operator.itemgetter(*self.keys) if flat else None)


@dataclass(frozen=True)
class TupleNode:
    children: tuple


Node = LeafNode | DictNode | TupleNode

Split = Callable[[Any, tuple], "tuple[str, tuple, tuple] | Any"]
"""``split(obj, path)``: ``("dict", keys, children)``, ``("tuple", (), children)``, or a codec (a leaf)."""


def build(obj: Any, split: Split) -> Node:
    """The tree of ``obj``: ``split`` says what each part is; leaf fields are numbered depth first."""
    count = [0]

    def make(part: Any, path: tuple) -> Node:
        what = split(part, path)
        if isinstance(what, tuple) and len(what) == 3 and what[0] in ("dict", "tuple"):
            kind, keys, children = what
            if kind == "dict":
                return DictNode(tuple(keys), tuple(make(c, path + (k,)) for k, c in zip(keys, children)))
            return TupleNode(tuple(make(c, path + (i,)) for i, c in enumerate(children)))
        first = count[0]
        count[0] += len(what.fields)
        return LeafNode(what, tuple(range(first, count[0])))

    return make(obj, ())


def fold(root: Node, fn: Callable[[tuple, Node, tuple], Any], path: tuple = ()) -> Any:
    """``fn(path, node, results)`` bottom-up, ``results`` the children's (empty for a leaf)."""
    if type(root) is LeafNode:
        return fn(path, root, ())
    keys = root.keys if type(root) is DictNode else range(len(root.children))
    return fn(path, root, tuple(fold(c, fn, path + (k,)) for k, c in zip(keys, root.children)))


def map_leaves(fn: Callable[[tuple, LeafNode], Any], root: Node) -> Any:
    """The structure of ``root`` (dicts and tuples) with ``fn(path, leaf)`` at each leaf."""
    return fold(root, lambda path, node, results: fn(path, node) if type(node) is LeafNode
                else dict(zip(node.keys, results)) if type(node) is DictNode else results)


def iter_nodes(root: Node) -> Iterator[tuple[tuple, Node]]:
    """Every (path, node), parents before their children, children in order."""
    return iter(fold(root, lambda path, node, results: [(path, node)] + [x for r in results for x in r]))


def iter_leaves(root: Node) -> Iterator[tuple[tuple, LeafNode]]:
    """Every (path, LeafNode), in leaf order."""
    return ((path, node) for path, node in iter_nodes(root) if type(node) is LeafNode)


def flatten(root: Node, sample: Any, items: str = "items") -> Sequence:
    """The values of ``sample`` at each leaf of ``root`` (in leaf order), checking that every Dict
    has exactly its keys and every Tuple its length; EmulationError names the path otherwise
    (``items`` names what a Tuple holds in it). The leaf values themselves are not checked (their
    codecs do that)."""
    if root.__class__ is DictNode and root.getter is not None:  # the commonest space: a Dict of leaves
        if sample.__class__ is not dict and not isinstance(sample, dict) or sample.keys() != root.keyset:
            refuse_keys(root, sample, ())
        return root.getter(sample)
    out: list = []
    _flatten(root, sample, (), out, items)
    return out


def _flatten(node: Node, sample: Any, path: tuple, out: list, items: str) -> None:
    kind = type(node)
    if kind is LeafNode:
        out.append(sample)
    elif kind is DictNode:
        if not isinstance(sample, dict) or sample.keys() != node.keyset:
            refuse_keys(node, sample, path)
        for key, child in zip(node.keys, node.children):
            _flatten(child, sample[key], path + (key,), out, items)
    else:
        if not isinstance(sample, (tuple, list)) or len(sample) != len(node.children):
            got = f"{type(sample).__name__} of length {len(sample)}" if isinstance(sample, (tuple, list)) \
                else repr(type(sample).__name__)
            raise EmulationError(f"at {format_path(path)}: expected a tuple of {len(node.children)} {items}, got {got}")
        for i, child in enumerate(node.children):
            _flatten(child, sample[i], path + (i,), out, items)


def refuse_keys(node: DictNode, value: Any, path: tuple) -> None:
    """Raise EmulationError naming what is missing or extra, where ``value`` is not a dict with ``node``'s keys."""
    if not isinstance(value, dict):
        raise EmulationError(f"at {format_path(path)}: expected a dict with keys {list(node.keys)}, got {type(value).__name__}")
    if len(value) != len(node.keys) or any(k not in value for k in node.keys):
        missing = [k for k in node.keys if k not in value]
        extra = [k for k in value if k not in node.keys]
        raise EmulationError(
            f"at {format_path(path)}: "
            + "; ".join(filter(None, [
                missing and "missing keys " + ", ".join(format_path(path + (k,)) for k in missing),
                extra and "unexpected keys " + ", ".join(format_path(path + (k,)) for k in extra),
            ])))


def unflatten(root: Node, values: Sequence) -> Any:
    """The structure of ``root`` with ``values`` (one per LeafNode, in leaf order) at its leaves."""
    it = iter(values)
    return map_leaves(lambda path, node: next(it), root)
