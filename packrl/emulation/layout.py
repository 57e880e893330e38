"""Layout: where every leaf of a space lives in one packed uint8 row.

Like a JAX treedef, the Layout is the structure kept apart from the data: an immutable,
comparable, JSON-serializable value. ``pack`` writes a sample's leaves into a row (checking
every leaf, casting nothing), ``unpack`` gives the space's own nested structure of zero-copy
views with each leaf's exact dtype.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from gymnasium import spaces

from packrl.emulation.codecs import LeafCodec, codec_for
from packrl.emulation.values import format_path, python_ints
from packrl.errors import EmulationError


@dataclass(frozen=True)
class Leaf:
    """One typed array in the row. ``field`` is None except for the parts of string leaves."""

    path: tuple
    dtype: np.dtype
    shape: tuple
    offset: int
    space: spaces.Space
    kind: str
    field: str | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def name(self) -> str:
        return format_path(self.path) + (f".{self.field}" if self.field else "")


# ---------------------------------------------------------------- tree nodes

@dataclass(frozen=True)
class LeafNode:
    codec: LeafCodec
    leaf_ids: tuple[int, ...]


@dataclass(frozen=True)
class DictNode:
    keys: tuple
    children: tuple

    @property
    def keyset(self) -> frozenset:
        return self.__dict__.get("_keyset") or self.__dict__.setdefault("_keyset", frozenset(self.keys))


@dataclass(frozen=True)
class TupleNode:
    children: tuple


Node = LeafNode | DictNode | TupleNode


def _build_tree(space: spaces.Space, path: tuple, codecs: list) -> Node:
    if isinstance(space, spaces.Dict):
        keys = tuple(space.spaces.keys())
        return DictNode(keys, tuple(_build_tree(space.spaces[k], path + (k,), codecs) for k in keys))
    if isinstance(space, spaces.Tuple):
        return TupleNode(tuple(_build_tree(s, path + (i,), codecs) for i, s in enumerate(space.spaces)))
    codec = codec_for(space, path)
    first = sum(len(c.fields) for _, c in codecs)
    codecs.append((path, codec))
    return LeafNode(codec, tuple(range(first, first + len(codec.fields))))


def _place_leaves(codecs: list) -> tuple[tuple[Leaf, ...], int]:
    """Offsets aligned to each dtype: widest dtypes first, so no padding is needed between leaves."""
    parts = [(path, codec, f) for path, codec in codecs for f in codec.fields]
    order = sorted(range(len(parts)), key=lambda i: -parts[i][2].dtype.alignment)
    offsets, cursor = [0] * len(parts), 0
    for i in order:
        align = parts[i][2].dtype.alignment
        cursor = -(-cursor // align) * align
        offsets[i] = cursor
        cursor += int(np.prod(parts[i][2].shape, dtype=np.int64)) * parts[i][2].dtype.itemsize
    widest = max((f.dtype.alignment for _, _, f in parts), default=1)
    nbytes = -(-cursor // widest) * widest
    leaves = tuple(
        Leaf(path, np.dtype(f.dtype), tuple(f.shape), offsets[i], codec.space, codec.kind, f.name)
        for i, (path, codec, f) in enumerate(parts)
    )
    return leaves, nbytes


class Layout:
    """Where each leaf of ``space`` sits in a packed uint8 row of ``nbytes`` bytes."""

    def __init__(self, space: spaces.Space, root: Node, leaves: tuple[Leaf, ...], nbytes: int):
        self.space = space
        self.root = root
        self.leaves = leaves
        self.nbytes = nbytes
        self.alignment = max((leaf.dtype.alignment for leaf in leaves), default=1)
        # plain (start, end, dtype name, shape) per leaf: constants that compiled code can read
        self.spans = tuple((leaf.offset, leaf.offset + leaf.nbytes, leaf.dtype.name, leaf.shape) for leaf in leaves)
        self.gaps = _gaps(leaves, nbytes)  # byte ranges no leaf covers (padding): kept zero
        self._key = json.dumps(self.to_dict(), sort_keys=True)
        self._last_bound: tuple = (None, None)  # (weakref to a buffer, its BoundRows): reused when packed again
        self._packs = 0  # samples packed in this process, until the compiled pack is made
        self._compiled: Any = None  # None: not yet; False: not available; else a CompiledPack
        self._unflatten_fn: Any = None

    @classmethod
    def from_space(cls, space: spaces.Space, round_floats: bool = False) -> "Layout":
        """Build the layout of any gymnasium space (Dict and Tuple to any depth).

        ``round_floats=True`` lets float64 values be rounded into float32 leaves (off by default:
        a value that does not survive the conversion exactly is refused)."""
        codecs: list = []
        root = _build_tree(space, (), codecs)
        if round_floats:
            for _, codec in codecs:
                if hasattr(codec, "round_floats"):
                    codec.round_floats = True
        leaves, nbytes = _place_leaves(codecs)
        return cls(space, root, leaves, nbytes)

    # ------------------------------------------------------------ pack

    def pack(self, sample: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Check ``sample`` against the space and write it into ``out`` (or a new ``(nbytes,)`` row).
        Nothing is written when the sample is refused."""
        if out is None:
            out = np.zeros(self.nbytes, dtype=np.uint8)
            fast = self._hot(1)
            if fast is None or not fast(sample, out.reshape(1, -1), 0):
                self._bound(out).pack_checked(sample)
            return out
        ref, bound = self._last_bound
        if ref is None or ref() is not out:
            bound = self._bound(out)  # checks a buffer the first time it is seen
        if bound.batch:
            raise EmulationError(f"pack writes one row: expected 1-d rows, got shape {out.shape} (use pack_batch)")
        fast = bound._fast
        if fast is None or not fast(sample, bound._rows2d, 0):  # the compiled pack, once the layout is hot
            if fast is None:
                bound.pack(sample)
            else:
                bound.pack_slow(sample)
        return out

    # ------------------------------------------------------------ the compiled pack

    def compiled_pack(self) -> Any:
        """The generated, Numba-compiled pack of this layout (see ``packrl.emulation.compiled``),
        made now if it is not yet; None where it cannot be made. Packing compiles it by itself once
        a layout has packed ``COMPILE_AFTER`` samples (env ``PACKRL_COMPILE_PACK``: ``auto``,
        ``always`` or ``never``)."""
        if self._compiled is None:
            self._compiled = False
            if len(self.leaves) <= MAX_COMPILED_LEAVES:
                from packrl.emulation.compiled import CompiledPack

                try:
                    self._compiled = CompiledPack(self)
                except Exception as err:  # noqa: BLE001 - any failure leaves the checked Python path
                    warnings.warn(f"packrl: no compiled pack for this layout ({type(err).__name__}: {err}); "
                                  "packing stays on the checked Python path", RuntimeWarning, stacklevel=2)
        return self._compiled or None

    def _hot(self, count: int) -> Any:
        """Count ``count`` packed samples; the compiled pack function once the layout is hot, else None."""
        if self._compiled is not None:
            return self._compiled.pack if self._compiled else None
        self._packs += count
        mode = os.environ.get("PACKRL_COMPILE_PACK", "auto")
        if mode == "never" or (mode != "always" and self._packs < COMPILE_AFTER):
            return None
        compiled = self.compiled_pack()
        return compiled.pack if compiled else None

    def pack_batch(self, samples: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Pack many samples into ``(N, nbytes)`` rows. ``samples`` is a list of samples, or one
        batched structure (arrays with a leading N axis, as gymnasium's ``batch_space`` gives).

        A list is written leaf by leaf across all samples: one stack and one check per leaf, so
        packing N samples costs far less than N calls of ``pack``. Nothing is written into ``out``
        when a sample is refused: the rows are packed apart and copied into ``out`` once all passed."""
        n = self._batch_size(samples)
        if out is None:
            return self._pack_rows(samples, np.zeros((n, self.nbytes), dtype=np.uint8), n)
        self._check_buffer(out, batch_ndim=1)
        _check_writable(out, "pack_batch: out")
        if out.shape[0] != n:
            raise EmulationError(f"pack_batch: out has {out.shape[0]} rows for {n} samples")
        out[...] = self._pack_rows(samples, np.empty((n, self.nbytes), dtype=np.uint8), n)
        return out

    def pack_rows(self, samples: Any, rows: np.ndarray) -> np.ndarray:
        """``pack_batch`` straight into ``rows`` (``(N, nbytes)`` uint8, N the number of samples),
        for a caller whose rows are worthless once a sample is refused (an env that fails): a
        refusal may leave the rows of the samples before it written."""
        n = self._batch_size(samples)
        if rows.shape != (n, self.nbytes) or rows.dtype != np.uint8:
            raise EmulationError(f"pack_rows: rows of shape {rows.shape} and dtype {rows.dtype} for {n} samples "
                                 f"of {self.nbytes} bytes (expected ({n}, {self.nbytes}) uint8)")
        _check_writable(rows, "pack_rows: rows")
        return self._pack_rows(samples, rows, n)

    def _pack_rows(self, samples: Any, rows: np.ndarray, n: int) -> np.ndarray:
        listed = isinstance(samples, list)
        for start, end in self.gaps:
            rows[:, start:end] = 0
        if listed and n and self._hot(n) is not None and rows.flags.c_contiguous \
                and self._compiled.pack_many(samples, rows, 0) == n:
            return rows
        views = self._views(rows)
        if listed:
            self._write_samples(self.root, samples, views, ())
        else:
            self._apply(self._checked(self.root, samples, (), (n,), []), views)
        return rows

    def _batch_size(self, samples: Any) -> int:
        if isinstance(samples, list):
            return len(samples)
        if isinstance(samples, tuple) and type(self.root) is not TupleNode:
            raise EmulationError("pack_batch takes a list of samples or one batched structure, got a tuple "
                                 f"of {len(samples)} items (a list of samples?)")
        n = self._batch_len(self.root, samples, ())
        return 0 if n is None else n

    def bind(self, rows: np.ndarray) -> "BoundRows":
        """Precompute the views of a persistent buffer, for packing into it at no per-call view cost."""
        return BoundRows(self, rows)

    def _checked(self, node: Node, value: Any, path: tuple, batch: tuple, out: list) -> list:
        """Check ``value`` against ``node``; append (leaf id, exact array) pairs to ``out``. Writes nothing."""
        if type(node) is LeafNode:
            out.extend(zip(node.leaf_ids, node.codec.check(value, path, batch)))
        elif type(node) is DictNode:
            if not isinstance(value, dict) or value.keys() != node.keyset:
                self._check_keys(node, value, path)
            for key, child in zip(node.keys, node.children):
                self._checked(child, value[key], path + (key,), batch, out)
        else:
            if not isinstance(value, (tuple, list)) or len(value) != len(node.children):
                got = f"{type(value).__name__} of length {len(value)}" if isinstance(value, (tuple, list)) else repr(type(value).__name__)
                raise EmulationError(f"at {format_path(path)}: expected a tuple of {len(node.children)} items, got {got}")
            for i, child in enumerate(node.children):
                self._checked(child, value[i], path + (i,), batch, out)
        return out

    @staticmethod
    def _apply(checked: list, views: list) -> None:
        for leaf_id, arr in checked:
            views[leaf_id][...] = arr

    @staticmethod
    def _check_keys(node: DictNode, value: Any, path: tuple) -> None:
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

    def _write_samples(self, node: Node, samples: list, views: list, path: tuple) -> None:
        """Write a list of samples, one leaf across all samples at a time."""
        if type(node) is DictNode:
            keyset = node.keyset
            try:
                same_keys = all([s.keys() == keyset for s in samples])
            except AttributeError:  # not a dict: the slow path below names the sample
                same_keys = False
            if not same_keys:
                for i, s in enumerate(samples):
                    try:
                        self._check_keys(node, s, path)
                    except EmulationError as err:
                        raise EmulationError(f"sample {i}: {err}") from None
            for k, c in zip(node.keys, node.children):
                self._write_samples(c, [s[k] for s in samples], views, path + (k,))
        elif type(node) is TupleNode:
            width = len(node.children)
            for i, s in enumerate(samples):
                if not isinstance(s, (tuple, list)) or len(s) != width:
                    raise EmulationError(f"sample {i}: at {format_path(path)}: expected a tuple of {width} items")
            for j, c in enumerate(node.children):
                self._write_samples(c, [s[j] for s in samples], views, path + (j,))
        else:
            self._write_column(node, samples, views, path)

    def _write_column(self, node: LeafNode, column: list, views: list, path: tuple) -> None:
        codec, n = node.codec, len(column)
        view = views[node.leaf_ids[0]]
        if codec.stores_input and n and view.nbytes >= STACK_INTO_ROWS_BYTES * n:
            try:  # large leaves go straight into the rows; this succeeds only when every dtype already matches
                np.stack(column, out=view, casting="no")
            except (TypeError, ValueError):
                pass
            else:
                codec.check(view, path, (n,))  # ranges and bounds, once for the whole batch
                return
        for leaf_id, arr in zip(node.leaf_ids, codec.check(_column_array(codec, column, path), path, (n,))):
            views[leaf_id][...] = arr

    def _batch_len(self, node: Node, value: Any, path: tuple) -> int | None:
        """The leading axis of a batched structure's first leaf; None where it holds no leaf."""
        if type(node) is DictNode:
            self._check_keys(node, value, path)
            children = zip(node.keys, node.children)
        elif type(node) is TupleNode:
            if not isinstance(value, (tuple, list)) or len(value) != len(node.children):
                raise EmulationError(f"at {format_path(path)}: expected a tuple of {len(node.children)} batched "
                                     f"items, got {type(value).__name__}")
            children = enumerate(node.children)
        else:
            children = None
        if children is not None:  # the first child that holds a leaf (an empty Dict or Tuple holds none)
            for key, child in children:
                n = self._batch_len(child, value[key], path + (key,))
                if n is not None:
                    return n
            return None
        shape = np.shape(value)
        if not shape:
            raise EmulationError(f"leaf {format_path(path)}: a batched structure needs a leading batch axis")
        return shape[0]

    # ------------------------------------------------------------ unpack

    def unpack(self, buf: np.ndarray) -> Any:
        """Views of ``buf`` (``(nbytes,)`` or ``(..., nbytes)`` uint8) in the space's own structure."""
        ref, bound = self._last_bound
        if ref is None or ref() is not buf:
            bound = self._bound(buf)  # checks a buffer the first time it is seen
        if bound.copy_tree is not None:
            return bound.copy_tree()
        return (self._unflatten_fn or self._make_unflatten())(bound.views)

    def unflatten(self, leaf_values: list) -> Any:
        """Rebuild the space's structure from one value per leaf (in ``self.leaves`` order)."""
        return (self._unflatten_fn or self._make_unflatten())(leaf_values)

    def _make_unflatten(self) -> Any:
        self._unflatten_fn = _unflatten_function(self.root)
        return self._unflatten_fn

    def to_native(self, unpacked: Any) -> Any:
        """Copies of the values the space itself produces (strings for Text, numpy scalars for Discrete)."""
        return _to_native(self.root, unpacked)

    def _views(self, buf: np.ndarray) -> list:
        return self._bound(buf).views

    def _bound(self, buf: np.ndarray) -> "BoundRows":
        """The BoundRows of ``buf``, kept for the last buffer seen: emulators pack the same rows every step."""
        ref, bound = self._last_bound
        if ref is None or ref() is not buf:
            bound = BoundRows(self, buf)
            self._last_bound = (weakref.ref(buf), bound)
        return bound

    def _make_views(self, buf: Any, batch: tuple) -> list:
        views = []
        for leaf in self.leaves:
            raw = buf[..., leaf.offset: leaf.offset + leaf.nbytes]
            views.append(raw.view(leaf.dtype).reshape(batch + leaf.shape))
        return views

    def _check_buffer(self, buf: Any, batch_ndim: int | None) -> None:
        if not isinstance(buf, np.ndarray):
            raise EmulationError(f"expected a numpy uint8 array of rows, got {type(buf).__name__}")
        if buf.dtype != np.uint8:
            raise EmulationError(f"rows must be uint8, got {buf.dtype} (a float cast of packed rows destroys them)")
        if buf.ndim < 1 or buf.shape[-1] != self.nbytes:
            wider = WIDER_ROWS_HINT if buf.ndim and buf.shape[-1] > self.nbytes else ""
            raise EmulationError(f"rows must have a last axis of {self.nbytes} bytes, got shape {buf.shape}{wider}")
        if batch_ndim is not None and buf.ndim != batch_ndim + 1:
            raise EmulationError(f"expected {batch_ndim + 1}-d rows, got shape {buf.shape}")
        if buf.size and buf.shape[-1] > 1 and buf.strides[-1] != 1:
            raise EmulationError(f"rows must be contiguous along the byte axis, got strides {buf.strides}")

    # ------------------------------------------------------------ plain data

    def to_dict(self) -> dict:
        return {"format": "packrl.layout/1", "nbytes": self.nbytes, "tree": _tree_to_dict(self.root),
                "leaves": [{"path": [_encode_key(k) for k in leaf.path], "field": leaf.field, "dtype": leaf.dtype.str,
                            "shape": list(leaf.shape), "offset": leaf.offset} for leaf in self.leaves]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict) -> "Layout":
        """The layout a ``to_dict()`` document describes; EmulationError for any document that is
        not one (malformed, or a tree whose offsets do not match its leaves)."""
        if not isinstance(data, dict) or not isinstance(data.get("tree"), dict):
            raise EmulationError(f"layout JSON must be an object with a 'tree' object, got {_short(data)}")
        codecs: list = []
        with _malformed("layout JSON"):
            root = _tree_from_dict(data["tree"], (), codecs)
            space = _space_of(root)
            leaves, nbytes = _place_leaves(codecs)
            layout = cls(space, root, leaves, nbytes)
            same = layout.to_dict() == data
        if not same:
            raise EmulationError("layout JSON is inconsistent: its offsets do not match its tree")
        return layout

    @classmethod
    def from_json(cls, text: str) -> "Layout":
        with _malformed("layout JSON"):
            data = json.loads(text)
        return cls.from_dict(data)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_last_bound"] = (None, None)  # a cache of views into one buffer does not travel
        state["_compiled"], state["_packs"], state["_unflatten_fn"] = None, 0, None  # made again where used
        return state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __iter__(self) -> Iterator[Leaf]:
        return iter(self.leaves)

    def __len__(self) -> int:
        return len(self.leaves)

    def __repr__(self) -> str:
        rows = [("path", "kind", "dtype", "shape", "offset", "bytes")]
        rows += [(leaf.name, leaf.kind, str(leaf.dtype), str(leaf.shape), str(leaf.offset), str(leaf.nbytes))
                 for leaf in self.leaves]
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return f"Layout({self.nbytes} bytes, {len(self.leaves)} leaves)\n" + "\n".join("  " + line for line in lines)


class BoundRows:
    """A layout bound to a persistent buffer: its leaf views are made once. One row packs through
    the layout's compiled pack once the layout is hot; otherwise (and to explain a refusal) the
    checked Python path runs, planned once for the two commonest shapes of space (one leaf; a
    Dict of plain leaves)."""

    def __init__(self, layout: Layout, rows: np.ndarray):
        layout._check_buffer(rows, batch_ndim=None)
        self.layout, self.rows = layout, rows
        self.batch = rows.shape[:-1]
        self.views = layout._make_views(rows, self.batch)
        self.tree = layout.unflatten(self.views)
        # a Dict of plain leaves unpacks as a copy of this tree: the same views in a new dict, made in C
        root = layout.root
        plain = type(root) is DictNode and all(type(c) is LeafNode and type(c.codec).view is LeafCodec.view
                                               for c in root.children)
        self.copy_tree = self.tree.copy if plain else None
        # one C-contiguous row: what the compiled pack writes into (as row 0 of a (1, nbytes) array)
        self._rows2d = rows.reshape(1, -1) if rows.ndim == 1 and rows.flags.c_contiguous and rows.flags.writeable \
            else None
        self._fast: Any = None
        root = layout.root
        if _one_field(root):
            self._leaf = (root.codec, self.views[root.leaf_ids[0]])
            self.pack_checked = self._pack_leaf
        elif type(root) is DictNode and root.keys and all(_one_field(c) for c in root.children):
            self._items = [(key, child.codec, self.views[child.leaf_ids[0]], (key,))
                           for key, child in zip(root.keys, root.children)]
            self.pack_checked = self._pack_flat_dict

    def pack(self, sample: Any) -> None:
        """Check and write one sample (or one batched structure, for a batch of rows). Nothing is
        written when the sample is refused."""
        fast = self._fast
        if fast is None and self._rows2d is not None:
            fast = self._fast = self.layout._hot(1)
            if fast is not None:  # from now on one call: the compiled pack bound to this row
                self.pack = self.layout._compiled.bind(self._rows2d, 0, self.pack_slow)
        if fast is None or not fast(sample, self._rows2d, 0):
            self.pack_slow(sample)

    def pack_slow(self, sample: Any) -> None:
        """The checked Python path, padding included (the compiled pack zeroes it too)."""
        _check_writable(self.rows, "pack: out")
        self.pack_checked(sample)
        for start, end in self.layout.gaps:
            self.rows[..., start:end] = 0

    def pack_checked(self, sample: Any) -> None:
        """The Python path: walk the tree, check every leaf, then write them all."""
        self.layout._apply(self.layout._checked(self.layout.root, sample, (), self.batch, []), self.views)

    def _pack_leaf(self, sample: Any) -> None:
        codec, view = self._leaf
        view[...] = codec.check(sample, (), self.batch)[0]

    def _pack_flat_dict(self, sample: Any) -> None:
        if type(sample) is not dict or sample.keys() != self.layout.root.keyset:
            BoundRows.pack_checked(self, sample)  # the tree walk names what is missing or extra
            return
        batch = self.batch
        checked = [(view, codec.check(sample[key], path, batch)[0]) for key, codec, view, path in self._items]
        for view, arr in checked:
            view[...] = arr


def _check_writable(buf: np.ndarray, what: str) -> None:
    if not buf.flags.writeable:
        raise EmulationError(f"{what} is a read-only array: packing writes into it (pass a writable copy)")


def _one_field(node: Node) -> bool:
    return type(node) is LeafNode and len(node.codec.fields) == 1


# ---------------------------------------------------------------- tree helpers

COMPILE_AFTER = 256
"""Samples a layout packs on the Python path before packrl compiles its pack (a few seconds the
first time on a machine, then loaded from Numba's disk cache)."""

MAX_COMPILED_LEAVES = 128
"""Layouts with more leaves stay on the Python path: the compile time grows with the leaves."""

WIDER_ROWS_HINT = ("; rows of a multi-agent env whose agents' spaces differ are as wide as the widest: "
                   "take one group's rows with env.emulated.rows_for(rows, group)")

STACK_INTO_ROWS_BYTES = 1024
"""Leaves at least this large are stacked straight into the rows; smaller ones go through one
``np.array`` of the column (a C loop, several times cheaper than ``np.stack`` on small arrays)."""


def _column_array(codec: LeafCodec, column: list, path: tuple) -> Any:
    """One leaf of many samples as one array (object array for strings). Where the column does not
    read as one regular numeric array, each sample is checked as ``pack`` checks it, so
    ``pack_batch`` accepts and refuses exactly the samples ``pack`` does, and names the sample."""
    if codec.kind in ("text", "bounded_string"):
        arr = np.empty(len(column), dtype=object)
        arr[:] = column
        return arr
    if not column:
        return np.zeros((0,) + codec.fields[0].shape, codec.fields[0].dtype)
    field = codec.fields[0]
    arrays = [type(v) is np.ndarray for v in column]
    if codec.stores_input and any(arrays):
        for i, v in enumerate(column):  # shapes first: np.array of a huge stride-0 view would copy all of it
            if arrays[i] and v.shape != field.shape:
                raise EmulationError(f"sample {i}: leaf {format_path(path)}: shape {v.shape} does not match the "
                                     f"space's {field.shape}")
    try:
        arr = np.array(column)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is not None and arr.dtype.kind in "fO" and field.dtype.kind in "iu" and len(codec.fields) == 1 \
            and not any([a and v.dtype == object for a, v in zip(arrays, column)]):  # pack refuses object arrays
        # Python ints beyond int64 beside smaller ones read as float64: convert them one by one
        exact = python_ints(column, field.dtype, (len(column), *field.shape), path)
        if exact is not None:
            return exact
    if arr is not None and arr.dtype != object:
        return arr
    return _checked_one_by_one(codec, column, path)


def _checked_one_by_one(codec: LeafCodec, column: list, path: tuple) -> np.ndarray:
    """The column checked sample by sample (as ``pack`` checks one), stacked."""
    checked = []
    for i, value in enumerate(column):
        try:
            checked.append(codec.check(value, path)[0])
        except EmulationError as err:
            raise EmulationError(f"sample {i}: {err}") from None
    return np.stack(checked)


def _unflatten_function(root: Node) -> Any:
    """A function that builds ``root``'s structure from the leaf values in one expression
    (generated once per layout: a Python tree walk costs a call per node on every unpack)."""
    names: dict[str, Any] = {}

    def key(k: Any) -> str:
        if type(k) in (str, int):
            return repr(k)
        names[f"key{len(names)}"] = k
        return f"key{len(names) - 1}"

    def expr(node: Node) -> str:
        if type(node) is LeafNode:
            if type(node.codec).view is LeafCodec.view:
                return f"v[{node.leaf_ids[0]}]"
            names[f"view{len(names)}"] = node.codec.view
            return f"view{len(names) - 1}(({''.join(f'v[{i}], ' for i in node.leaf_ids)}))"
        if type(node) is DictNode:
            return "{" + "".join(f"{key(k)}: {expr(c)}, " for k, c in zip(node.keys, node.children)) + "}"
        return "(" + "".join(f"{expr(c)}, " for c in node.children) + ")"

    code = f"lambda v: {expr(root)}"
    return eval(code, names)  # noqa: S307 - the text is built above from the layout alone


def _gaps(leaves: tuple, nbytes: int) -> tuple[tuple[int, int], ...]:
    """The byte ranges of a row that no leaf covers."""
    gaps, cursor = [], 0
    for start, end in sorted((leaf.offset, leaf.offset + leaf.nbytes) for leaf in leaves):
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, end)
    if nbytes > cursor:
        gaps.append((cursor, nbytes))
    return tuple(gaps)


def _to_native(node: Node, value: Any) -> Any:
    if type(node) is LeafNode:
        return node.codec.to_native(value)
    if type(node) is DictNode:
        return {k: _to_native(c, value[k]) for k, c in zip(node.keys, node.children)}
    return tuple(_to_native(c, value[i]) for i, c in enumerate(node.children))


def _space_of(node: Node) -> spaces.Space:
    if type(node) is LeafNode:
        return node.codec.space
    if type(node) is DictNode:
        return spaces.Dict({k: _space_of(c) for k, c in zip(node.keys, node.children)})
    return spaces.Tuple(tuple(_space_of(c) for c in node.children))


def iter_leaf_nodes(node: Node, path: tuple = ()) -> Iterator[tuple[tuple, LeafNode]]:
    """Every (path, LeafNode) of a tree, depth first."""
    if type(node) is LeafNode:
        yield path, node
    elif type(node) is DictNode:
        for k, c in zip(node.keys, node.children):
            yield from iter_leaf_nodes(c, path + (k,))
    else:
        for i, c in enumerate(node.children):
            yield from iter_leaf_nodes(c, path + (i,))


def _encode_key(key: Any, path: tuple = ()) -> Any:
    """A Dict key as JSON. NumPy scalar keys are written as the Python value they equal (and hash
    like), so a layout read back looks its keys up the same way."""
    if isinstance(key, (bool, np.bool_)) or key is None:
        return {"const": None if key is None else bool(key)}
    if isinstance(key, str):
        return {"str": str(key)}
    if isinstance(key, (int, np.integer)):
        return {"int": int(key)}
    if isinstance(key, (float, np.floating)):
        return {"float": float(key)}
    if isinstance(key, tuple):
        return {"tuple": [_encode_key(k, path) for k in key]}
    raise EmulationError(f"at {format_path(path)}: Dict key {key!r} of type {type(key).__name__} cannot be written "
                         "to JSON; use str, int, float, bool, None or tuples of them")


def _decode_key(obj: dict) -> Any:
    (tag, value), = obj.items()
    return tuple(_decode_key(k) for k in value) if tag == "tuple" else value


def _tree_to_dict(node: Node, path: tuple = ()) -> dict:
    if type(node) is LeafNode:
        return {"leaf": node.codec.spec()}
    if type(node) is DictNode:
        return {"dict": [[_encode_key(k, path), _tree_to_dict(c, path + (k,))] for k, c in zip(node.keys, node.children)]}
    return {"tuple": [_tree_to_dict(c, path + (i,)) for i, c in enumerate(node.children)]}


MAX_JSON_LEAF_ELEMENTS = 2**24
"""Most elements one leaf of a layout read from JSON may have: its bounds are built as arrays, and a
document must not be able to ask for gigabytes."""


@contextlib.contextmanager
def _malformed(what: str, path: tuple | None = None) -> Iterator[None]:
    """Turn the errors a malformed document raises on its way through json, NumPy and gymnasium
    into EmulationError naming ``what`` (and the tree path)."""
    try:
        yield
    except EmulationError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError, IndexError, OverflowError, AssertionError,
            RecursionError, MemoryError) as err:
        where = "" if path is None else f" at {format_path(path)}"
        raise EmulationError(f"{what}{where} is malformed: {type(err).__name__}: {_short(err)}") from None


def _short(value: Any) -> str:
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _tree_from_dict(obj: dict, path: tuple, codecs: list) -> Node:
    if not isinstance(obj, dict) or len(obj) != 1 or next(iter(obj)) not in ("leaf", "dict", "tuple"):
        raise EmulationError(f"layout JSON at {format_path(path)}: a tree node is an object with one key, "
                             f"'leaf', 'dict' or 'tuple'; got {_short(obj)}")
    if "leaf" in obj:
        spec = obj["leaf"]
        if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
            raise EmulationError(f"layout JSON at {format_path(path)}: a leaf is an object with a string 'kind', "
                                 f"got {_short(spec)}")
        cls = LeafCodec.kinds.get(spec["kind"])
        if cls is None:
            raise EmulationError(f"leaf {format_path(path)}: unknown codec kind {spec['kind']!r} (import the module that defines it)")
        shape = spec.get("shape", [])
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) \
                or math.prod(shape) > MAX_JSON_LEAF_ELEMENTS:
            raise EmulationError(f"layout JSON at {format_path(path)}: shape {_short(shape)} must be a list of "
                                 f"non-negative ints with at most {MAX_JSON_LEAF_ELEMENTS} elements in all")
        with _malformed("layout JSON", path):
            codec = cls.from_spec(spec)
        first = sum(len(c.fields) for _, c in codecs)
        codecs.append((path, codec))
        return LeafNode(codec, tuple(range(first, first + len(codec.fields))))
    if "dict" in obj:
        with _malformed("layout JSON", path):
            keys = tuple(_decode_key(k) for k, _ in obj["dict"])
        return DictNode(keys, tuple(_tree_from_dict(c, path + (k,), codecs) for k, (_, c) in zip(keys, obj["dict"])))
    if not isinstance(obj["tuple"], list):
        raise EmulationError(f"layout JSON at {format_path(path)}: 'tuple' must be a list, got {_short(obj['tuple'])}")
    return TupleNode(tuple(_tree_from_dict(c, path + (i,), codecs) for i, c in enumerate(obj["tuple"])))
