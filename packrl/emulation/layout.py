"""Layout: where every leaf of a space lives in one packed uint8 row.

Like a JAX treedef, the Layout is the structure kept apart from the data: an immutable,
comparable, JSON-serializable value. ``pack`` writes a sample's leaves into a row (checking
every leaf, casting nothing), ``unpack`` gives the space's own nested structure of zero-copy
views with each leaf's exact dtype. The structure is a ``packrl.emulation.tree``; packing (the
compiled pack, and the checked Python path) is its ``Packer``'s.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import weakref
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Iterator

import numpy as np
from gymnasium import spaces

from packrl.emulation.codecs import Field, LeafCodec, codec_for
from packrl.emulation.packer import BoundRows, Packer, _fastpack, check_writable
from packrl.emulation.tree import DictNode, LeafNode, Node, build, flatten, fold, iter_leaves, unflatten
from packrl.emulation.values import Bounds, format_path, short
from packrl.errors import EmulationError


@dataclass(frozen=True)
class Leaf:
    """One typed array in the row: one field of a leaf's codec. ``field`` is the field's name (None
    for a leaf of one unnamed field); ``codec`` says what the leaf can do, ``bounds`` are the field's
    own (``codec.field_bounds()``; None where it is not bounded)."""

    path: tuple
    dtype: np.dtype
    shape: tuple
    offset: int
    space: spaces.Space
    kind: str
    field: str | None = None
    codec: LeafCodec | None = dataclass_field(default=None, compare=False, repr=False)
    bounds: Bounds | None = dataclass_field(default=None, compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def name(self) -> str:
        return format_path(self.path) + (f".{self.field}" if self.field else "")


def _split_space(space: spaces.Space, path: tuple, round_floats: bool = False) -> Any:
    """One node of a space, for ``tree.build``: its children, or its leaf's codec."""
    if isinstance(space, spaces.Dict):
        return "dict", tuple(space.spaces.keys()), tuple(space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return "tuple", (), space.spaces
    codec = codec_for(space, path)
    return _checked_fields(codec.rounding_floats() if round_floats else codec, path)


def _checked_fields(codec: LeafCodec, path: tuple) -> LeafCodec:
    """Refuse a codec whose fields cannot be placed or named: at least one Field, and for several,
    distinct identifier names (Numba envs name a field ``<key>_<name>``), bounds of the field's shape."""
    fields = getattr(codec, "fields", None)
    where = f"leaf {format_path(path)}: codec {type(codec).__qualname__}"
    if not isinstance(fields, tuple) or not fields or not all(isinstance(f, Field) for f in fields):
        raise EmulationError(f"{where}: fields must be a non-empty tuple of packrl.emulation.Field, got {short(fields)}")
    names = [f.name for f in fields]
    if len(fields) > 1 and (len(set(names)) != len(names) or not all(isinstance(n, str) and n.isidentifier()
                                                                        for n in names)):
        raise EmulationError(f"{where}: a leaf of several fields names each with a distinct identifier, got {names}")
    for f in fields:
        if f.bounds is not None and (f.bounds.dtype != np.dtype(f.dtype) or f.bounds.shape != tuple(f.shape)):
            raise EmulationError(f"{where}: field {f.name!r} has bounds of {f.bounds.dtype} {f.bounds.shape}, "
                                 f"the field is {np.dtype(f.dtype)} {tuple(f.shape)}")
    return codec


def _place_leaves(root: Node) -> tuple[tuple[Leaf, ...], int]:
    """Offsets aligned to each dtype: widest dtypes first, so no padding is needed between leaves."""
    parts = [(path, node.codec, f, b) for path, node in iter_leaves(root)
             for f, b in zip(node.codec.fields, node.codec.field_bounds())]
    order = sorted(range(len(parts)), key=lambda i: -parts[i][2].dtype.alignment)
    offsets, cursor = [0] * len(parts), 0
    for i in order:
        align = parts[i][2].dtype.alignment
        cursor = -(-cursor // align) * align
        offsets[i] = cursor
        cursor += int(np.prod(parts[i][2].shape, dtype=np.int64)) * parts[i][2].dtype.itemsize
    widest = max((f.dtype.alignment for _, _, f, _ in parts), default=1)
    nbytes = -(-cursor // widest) * widest
    leaves = tuple(
        Leaf(path, np.dtype(f.dtype), tuple(f.shape), offsets[i], codec.space, codec.kind, f.name, codec, bounds)
        for i, (path, codec, f, bounds) in enumerate(parts)
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
        # the one pass-through predicate: a lone Box may travel as its own rows (the leaf's dtype and
        # shape) instead of packed bytes; emulation (rows.row_format) and every reader of rows ask this
        self.box = leaves[0] if type(root) is LeafNode and isinstance(space, spaces.Box) else None
        self.key = json.dumps(self.to_dict(), sort_keys=True)
        self.packer = Packer(root, leaves, nbytes, self.gaps, self.key)
        self._unflatten_fn = _unflatten_function(root)
        self._last: tuple = (None, None)  # (weakref to a buffer, its BoundRows), see _bound_rows

    @classmethod
    def from_space(cls, space: spaces.Space, round_floats: bool = False) -> "Layout":
        """Build the layout of any gymnasium space (Dict and Tuple to any depth).

        ``round_floats=True`` lets float64 values be rounded into float32 leaves (off by default:
        a value that does not survive the conversion exactly is refused)."""
        root = build(space, functools.partial(_split_space, round_floats=round_floats))
        return cls(space, root, *_place_leaves(root))

    # ------------------------------------------------------------ pack

    def pack(self, sample: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Check ``sample`` against the space and write it into ``out`` (or a new ``(nbytes,)`` row).
        Nothing is written when the sample is refused."""
        if out is None:
            out = np.zeros(self.nbytes, dtype=np.uint8)
            spec = self.packer.spec
            if spec is None or _fastpack.pack(spec, sample, out, 0):
                self.packer.write(sample, self.packer.views(out, ()), ())
            return out
        bound = self._bound_rows(out)
        if bound.batch:
            raise EmulationError(f"pack writes one row: expected 1-d rows, got shape {out.shape} (use pack_batch)")
        bound.pack(sample)
        return out

    def compiled_pack(self) -> Any:
        """This layout's compiled pack (``packrl.emulation.compiled``: ``pack(sample, rows, r)`` and
        ``pack_many(samples, rows, first)``, True or a count where written); None without the C
        extension. ``pack`` and ``pack_batch`` use it by themselves."""
        return self.packer.compiled_pack()

    def pack_batch(self, samples: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Pack many samples into ``(N, nbytes)`` rows. ``samples`` is a list of samples, or one
        batched structure (arrays with a leading N axis, as gymnasium's ``batch_space`` gives).

        A list is written leaf by leaf across all samples: one stack and one check per leaf, so
        packing N samples costs far less than N calls of ``pack``. Nothing is written into ``out``
        when a sample is refused: the rows are packed apart and copied into ``out`` once all passed."""
        n = self.packer.batch_size(samples)
        if out is None:
            return self.packer.pack_rows(samples, np.zeros((n, self.nbytes), dtype=np.uint8), n)
        self.packer.check_buffer(out, batch_ndim=1)
        check_writable(out, "pack_batch: out")
        if out.shape[0] != n:
            raise EmulationError(f"pack_batch: out has {out.shape[0]} rows for {n} samples")
        out[...] = self.packer.pack_rows(samples, np.empty((n, self.nbytes), dtype=np.uint8), n)
        return out

    def pack_rows(self, samples: Any, rows: np.ndarray) -> np.ndarray:
        """``pack_batch`` straight into ``rows`` (``(N, nbytes)`` uint8, N the number of samples),
        for a caller whose rows are worthless once a sample is refused (an env that fails): a
        refusal may leave the rows of the samples before it written."""
        n = self.packer.batch_size(samples)
        if rows.shape != (n, self.nbytes) or rows.dtype != np.uint8:
            raise EmulationError(f"pack_rows: rows of shape {rows.shape} and dtype {rows.dtype} for {n} samples "
                                 f"of {self.nbytes} bytes (expected ({n}, {self.nbytes}) uint8)")
        check_writable(rows, "pack_rows: rows")
        return self.packer.pack_rows(samples, rows, n)

    def bind(self, rows: np.ndarray) -> BoundRows:
        """Precompute the views of a persistent buffer, for packing into it at no per-call view cost."""
        return BoundRows(self.packer, rows, self._unflatten_fn)  # not the bound method: no cycle through _last

    # ------------------------------------------------------------ unpack

    def unpack(self, buf: np.ndarray) -> Any:
        """Views of ``buf`` (``(nbytes,)`` or ``(..., nbytes)`` uint8) in the space's own structure."""
        return self._bound_rows(buf).unpack()

    def unflatten(self, leaf_values: list) -> Any:
        """Rebuild the space's structure from one value per leaf (in ``self.leaves`` order)."""
        return self._unflatten_fn(leaf_values)

    def _bound_rows(self, buf: np.ndarray) -> BoundRows:
        """``bind(buf)``, kept for the next call with the same array of the same shape (emulators and
        users pack and read the same rows every step; binding costs a view per leaf). The bound rows
        hold only views of ``buf``: a call behaves exactly as through a fresh ``bind``."""
        ref, bound = self._last
        if ref is None or ref() is not buf or bound.shape != buf.shape:
            bound = self.bind(buf)  # checks the buffer
            self._last = (weakref.ref(buf), bound)
        return bound

    def to_native(self, unpacked: Any) -> Any:
        """Copies of the values the space itself produces (strings for Text, numpy scalars for Discrete)."""
        return unflatten(self.root, [node.codec.to_native(value) for (_, node), value
                                     in zip(self.packer.leaf_nodes, flatten(self.root, unpacked))])

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
            raise EmulationError(f"layout JSON must be an object with a 'tree' object, got {short(data, 200)}")
        with _malformed("layout JSON"):
            root = build(data["tree"], _split_json)
            layout = cls(_space_of(root), root, *_place_leaves(root))
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
        # generated code does not pickle (made again on arrival); the views of the last buffer do not travel
        return {**self.__dict__, "_unflatten_fn": None, "_last": (None, None)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._unflatten_fn = _unflatten_function(self.root)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

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


# ---------------------------------------------------------------- tree helpers

def _unflatten_function(root: Node) -> Any:
    """A function that builds ``root``'s structure from the leaf values in one expression
    (generated once per layout: a Python tree walk costs a call per node on every unpack)."""
    names: dict[str, Any] = {}

    def key(k: Any) -> str:
        if type(k) in (str, int):
            return repr(k)
        names[f"key{len(names)}"] = k
        return f"key{len(names) - 1}"

    def expr(path: tuple, node: Node, parts: tuple) -> str:
        if type(node) is LeafNode:
            if type(node.codec).view is LeafCodec.view and len(node.leaf_ids) == 1:
                return f"v[{node.leaf_ids[0]}]"
            names[f"view{len(names)}"] = node.codec.view
            return f"view{len(names) - 1}(({''.join(f'v[{i}], ' for i in node.leaf_ids)}))"
        if type(node) is DictNode:
            return "{" + "".join(f"{key(k)}: {p}, " for k, p in zip(node.keys, parts)) + "}"
        return "(" + "".join(f"{p}, " for p in parts) + ")"

    code = f"lambda v: {fold(root, expr)}"
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


def _space_of(root: Node) -> spaces.Space:
    return fold(root, lambda path, node, parts: node.codec.space if type(node) is LeafNode
                else spaces.Dict(dict(zip(node.keys, parts))) if type(node) is DictNode else spaces.Tuple(parts))


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


def _tree_to_dict(root: Node) -> dict:
    def node_dict(path: tuple, node: Node, results: tuple) -> dict:
        if type(node) is LeafNode:
            return {"leaf": node.codec.spec()}
        if type(node) is DictNode:
            return {"dict": [[_encode_key(k, path), r] for k, r in zip(node.keys, results)]}
        return {"tuple": list(results)}

    return fold(root, node_dict)


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
        raise EmulationError(f"{what}{where} is malformed: {type(err).__name__}: {short(err, 200)}") from None


def _split_json(obj: Any, path: tuple) -> Any:
    """One node of a layout JSON tree, for ``tree.build``: its children, or its leaf's codec."""
    if not isinstance(obj, dict) or len(obj) != 1 or next(iter(obj)) not in ("leaf", "dict", "tuple"):
        raise EmulationError(f"layout JSON at {format_path(path)}: a tree node is an object with one key, "
                             f"'leaf', 'dict' or 'tuple'; got {short(obj, 200)}")
    if "dict" in obj:
        with _malformed("layout JSON", path):
            return "dict", tuple(_decode_key(k) for k, _ in obj["dict"]), [c for _, c in obj["dict"]]
    if "tuple" in obj:
        if not isinstance(obj["tuple"], list):
            raise EmulationError(f"layout JSON at {format_path(path)}: 'tuple' must be a list, got {short(obj['tuple'], 200)}")
        return "tuple", (), obj["tuple"]
    spec = obj["leaf"]
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
        raise EmulationError(f"layout JSON at {format_path(path)}: a leaf is an object with a string 'kind', "
                             f"got {short(spec, 200)}")
    cls = LeafCodec.kinds.get(spec["kind"])
    if cls is None:
        raise EmulationError(f"leaf {format_path(path)}: unknown codec kind {spec['kind']!r} (import the module that defines it)")
    shape = spec.get("shape", [])
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) \
            or math.prod(shape) > MAX_JSON_LEAF_ELEMENTS:
        raise EmulationError(f"layout JSON at {format_path(path)}: shape {short(shape, 200)} must be a list of "
                             f"non-negative ints with at most {MAX_JSON_LEAF_ELEMENTS} elements in all")
    with _malformed("layout JSON", path):
        return _checked_fields(cls.from_spec(spec), path)
