"""The compiled pack: one C call (``packrl.emulation._fastpack``) checks and writes a whole sample.

``spec_for(packer)`` describes a layout to the C extension as its tree (as ``_fastaction.c``
reads an action layout's): each Dict node with its keys, each Tuple node, and at each leaf its
fields' dtype, shape, offset and integer bounds. ``_fastpack.pack(spec, sample, rows, r)`` walks
the sample along that tree, checks every field (exact dtype and shape, in any memory layout;
bounds), and only when all passed copies each into row ``r`` and zeroes the row's padding. A
leaf whose codec's check is more than its bounds (strings, a user's codec through
``register_space``) is checked by calling that codec from C, and the arrays it returns are copied.

The compiled pack only accepts, it never explains: anything else makes it write nothing and
return nonzero, and the Packer's checked Python path then converts what converts exactly and names
what does not. Without a C compiler at install the extension is missing, ``spec_for`` gives None
and every sample takes the checked Python path.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from packrl.emulation.tree import DictNode, LeafNode, Node, fold

try:
    from packrl.emulation import _fastpack
except ImportError:  # built without a C compiler: the checked Python path packs everything
    _fastpack = None


def spec_for(packer: Any) -> Any:
    """The C extension's description of a ``packrl.emulation.packer.Packer``'s layout (the packer module imports
    this one, so its class is not imported back); None where the extension is missing."""
    if _fastpack is None:
        return None
    fields = [_field(leaf, in_c=False) for leaf in packer.leaves]
    leaves: list[tuple] = []

    def node_spec(path: tuple, node: Node, children: tuple) -> Any:
        if type(node) is not LeafNode:
            return (node.keys if type(node) is DictNode else None, children)
        first, codec = node.leaf_ids[0], node.codec
        if _checked_in_c(codec, packer.leaves[first].dtype):
            fields[first] = _field(packer.leaves[first], in_c=True)
            leaves.append((None, path, first, 1))
        else:  # the codec checks it in Python, C copies the arrays it returns
            leaves.append((codec.check, path, first, len(node.leaf_ids)))
        return len(leaves) - 1

    tree = fold(packer.root, node_spec)  # leaves are numbered in leaf order, as their fields are
    return _fastpack.make_spec(packer.nbytes, tuple(packer.gaps), tuple(fields), tuple(leaves), tree)


class CompiledPack:
    """A layout's compiled pack, for callers that want booleans: ``pack(sample, rows, r)`` writes
    ``sample`` into ``rows[r]`` and returns True, or returns False having written nothing;
    ``pack_many(samples, rows, first)`` packs a list into ``rows[first:]`` and returns how many it
    packed before the first it did not take. (The Packer calls ``_fastpack`` itself.)"""

    def __init__(self, spec: Any):
        self.spec = spec

    def pack(self, sample: Any, rows: np.ndarray, r: int) -> bool:
        return _fastpack.pack(self.spec, sample, rows, r) == 0

    def pack_many(self, samples: list, rows: np.ndarray, first: int) -> int:
        return _fastpack.pack_many(self.spec, samples, rows, first)


def _checked_in_c(codec: Any, dtype: np.dtype) -> bool:
    """Whether C checks the leaf itself: its codec's check is exactly its bounds (one field), and the
    dtype is a native bool, integer or float of 1, 2, 4 or 8 bytes."""
    return codec.check_is_bounds() and dtype.kind in "biuf" and dtype.itemsize in (1, 2, 4, 8) and dtype.isnative


def _field(leaf: Any, in_c: bool) -> tuple:
    """One field for ``make_spec``: (kind, itemsize, shape, offset, lo, hi, scalar class, takes ints).
    Bounds, where C checks the field: uniform ones as ints, else flat arrays (a bool's as its bytes);
    those spanning the whole dtype are not checked, except a Discrete's, which bound its Python ints."""
    dtype, bounds, lo, hi = leaf.dtype, leaf.bounds, None, None
    takes_int = in_c and leaf.shape == () and leaf.codec.takes_python_ints and bounds is not None \
        and bounds.integer and dtype.kind in "iu"
    if in_c and bounds is not None and bounds.integer and (bounds.needed or takes_int):
        if bounds.uniform is not None:
            lo, hi = int(bounds.uniform[0]), int(bounds.uniform[1])
        else:
            lo, hi = bounds.low.reshape(-1).copy(), bounds.high.reshape(-1).copy()
    scalar = dtype.type if in_c and leaf.shape == () else None
    return dtype.kind, dtype.itemsize, tuple(leaf.shape), leaf.offset, lo, hi, scalar, takes_int
