"""Packer: how a Layout writes samples into rows.

Every sample goes first to the compiled pack (``packrl.emulation.compiled``: one C call walks the
sample's tree, checks every leaf and writes the row, or writes nothing); whatever it does not
take goes to the checked Python path (flatten the tree, each codec checks its leaf, then every
leaf is written), which converts what converts exactly and names what does not. Without the C
extension the checked Python path packs everything. The Packer holds only the layout's parts (no
reference back to the Layout), so nothing it holds keeps a cycle alive.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from packrl.emulation import compiled
from packrl.emulation.codecs import LeafCodec
from packrl.emulation.compiled import _fastpack
from packrl.emulation.tree import DictNode, LeafNode, Node, TupleNode, flatten, iter_leaves
from packrl.emulation.values import format_path
from packrl.errors import EmulationError

STACK_INTO_ROWS_BYTES = 1024
"""Leaves at least this large are stacked straight into the rows; smaller ones go through one
``np.array`` of the column (a C loop, several times cheaper than ``np.stack`` on small arrays)."""

WIDER_ROWS_HINT = ("; rows of a multi-agent env whose agents' spaces differ are as wide as the widest: "
                   "take one group's rows with env.emulated.rows_for(rows, group)")


class Packer:
    """The pack side of a layout: buffer checks, the compiled pack's spec (``spec``: None without
    the C extension) and the checked Python path."""

    def __init__(self, root: Node, leaves: tuple, nbytes: int, gaps: tuple, key: str):
        self.root, self.leaves, self.nbytes, self.gaps, self.key = root, leaves, nbytes, gaps, key
        self.leaf_nodes = tuple(iter_leaves(root))
        self.checks = tuple((path, node.codec, node.leaf_ids) for path, node in self.leaf_nodes)
        self.one_field = all(len(ids) == 1 for _, _, ids in self.checks)
        self.spec = _spec_for(self)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "spec": None}  # a capsule: made again where the packer arrives

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.spec = _spec_for(self)

    def compiled_pack(self) -> compiled.CompiledPack | None:
        """The compiled pack, as booleans; None without the C extension."""
        return None if self.spec is None else compiled.CompiledPack(self.spec)

    # ------------------------------------------------------------ buffers

    def check_buffer(self, buf: Any, batch_ndim: int | None) -> None:
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

    def views(self, buf: Any, batch: tuple) -> list:
        """One typed view of ``buf`` per leaf, shape ``batch + leaf.shape``."""
        return [buf[..., leaf.offset: leaf.offset + leaf.nbytes].view(leaf.dtype).reshape(batch + leaf.shape)
                for leaf in self.leaves]

    # ------------------------------------------------------------ the checked Python path

    def write(self, sample: Any, views: list, batch: tuple) -> None:
        """Check ``sample`` (one, or one batched structure for a batch of rows): flatten it, each
        leaf's codec checks its value, then write every field. Nothing is written when it is refused."""
        values = flatten(self.root, sample, "batched items" if batch else "items")
        checked = []
        for (path, codec, _), value in zip(self.checks, values):
            try:
                checked.append(codec.check(value, path, batch))
            except EmulationError as err:
                raise codec.refused(err) from None
        if self.one_field:  # leaf i is view i
            for view, arrays in zip(views, checked):
                view[...] = arrays[0]
            return
        for (_, _, ids), arrays in zip(self.checks, checked):
            for leaf_id, arr in zip(ids, arrays):
                views[leaf_id][...] = arr

    # ------------------------------------------------------------ many samples

    def batch_size(self, samples: Any) -> int:
        if isinstance(samples, list):
            return len(samples)
        if isinstance(samples, tuple) and type(self.root) is not TupleNode:
            raise EmulationError("pack_batch takes a list of samples or one batched structure, got a tuple "
                                 f"of {len(samples)} items (a list of samples?)")
        values = flatten(self.root, samples, "batched items")
        if not values:
            return 0
        shape = np.shape(values[0])
        if not shape:
            raise EmulationError(f"leaf {format_path(self.leaf_nodes[0][0])}: a batched structure needs a leading batch axis")
        return shape[0]

    def pack_rows(self, samples: Any, rows: np.ndarray, n: int) -> np.ndarray:
        """Pack a list of ``n`` samples, or one batched structure, into ``rows`` (``(n, nbytes)``)."""
        listed = isinstance(samples, list)
        for start, end in self.gaps:
            rows[:, start:end] = 0
        if listed and n and self.spec is not None and rows.flags.c_contiguous \
                and _fastpack.pack_many(self.spec, samples, rows, 0) == n:
            return rows
        views = self.views(rows, (n,))
        if listed:
            self._write_columns(samples, views)
        else:
            self.write(samples, views, (n,))
        return rows

    def _write_columns(self, samples: list, views: list) -> None:
        """Write a list of samples one leaf across all samples at a time: one stack and one check per leaf."""
        flat = []
        for i, sample in enumerate(samples):
            try:
                flat.append(flatten(self.root, sample))
            except EmulationError as err:
                raise EmulationError(f"sample {i}: {err}") from None
        columns = zip(*flat) if flat else ([] for _ in self.leaf_nodes)
        for (path, node), column in zip(self.leaf_nodes, columns):
            self._write_column(node, list(column), views, path)

    def _write_column(self, node: Any, column: list, views: list, path: tuple) -> None:
        codec, n = node.codec, len(column)
        view = views[node.leaf_ids[0]]
        if codec.stores_input and n and view.nbytes >= STACK_INTO_ROWS_BYTES * n:
            try:  # large leaves go straight into the rows; this succeeds only when every dtype already matches
                np.stack(column, out=view, casting="no")
            except (TypeError, ValueError):
                pass
            else:
                try:
                    codec.check(view, path, (n,))  # ranges and bounds, once for the whole batch
                except EmulationError as err:
                    raise codec.refused(err) from None
                return
        try:
            arrays = codec.check_column(column, path)
        except EmulationError as err:
            raise codec.refused(err) from None
        for leaf_id, arr in zip(node.leaf_ids, arrays):
            views[leaf_id][...] = arr


class BoundRows:
    """Rows bound to a layout's packer (not to the Layout: no cycle), their leaf views made once.
    ``pack`` writes one sample through the compiled pack, or (for what it does not take, to
    explain a refusal, and for a batch of rows given one batched structure) the checked Python path."""

    def __init__(self, packer: Packer, rows: np.ndarray, unflatten: Any):
        packer.check_buffer(rows, batch_ndim=None)
        self.packer, self.rows = packer, rows
        self.shape, self.batch = rows.shape, rows.shape[:-1]
        self._unflatten = unflatten
        self.views = packer.views(rows, self.batch)
        self.tree = unflatten(self.views)
        # a Dict of plain leaves unpacks as a copy of this tree: the same views in a new dict, made in C
        root = packer.root
        plain = type(root) is DictNode and all(type(c) is LeafNode and type(c.codec).view is LeafCodec.view
                                               and len(c.leaf_ids) == 1 for c in root.children)
        self.copy_tree = self.tree.copy if plain else None
        # one C-contiguous writable row: what the compiled pack writes into
        self.spec = packer.spec if rows.ndim == 1 and rows.flags.c_contiguous and rows.flags.writeable else None

    def unpack(self) -> Any:
        """The rows' views in the space's structure, as a new structure (``tree`` is made once)."""
        return self.copy_tree() if self.copy_tree is not None else self._unflatten(self.views)

    def pack(self, sample: Any) -> None:
        """Check and write one sample. Nothing is written when the sample is refused."""
        if self.spec is None or _fastpack.pack(self.spec, sample, self.rows, 0):
            check_writable(self.rows, "pack: out")
            self.packer.write(sample, self.views, self.batch)
            for start, end in self.packer.gaps:  # zeroed, as the compiled pack does
                self.rows[..., start:end] = 0

    def pack_checked(self, sample: Any) -> None:
        """The checked Python path alone (padding left as it is)."""
        self.packer.write(sample, self.views, self.batch)


def check_writable(buf: np.ndarray, what: str) -> None:
    if not buf.flags.writeable:
        raise EmulationError(f"{what} is a read-only array: packing writes into it (pass a writable copy)")


def _spec_for(packer: Packer) -> Any:
    """The compiled pack's spec of a packer; None (with a warning) where it cannot be made."""
    try:
        return compiled.spec_for(packer)
    except Exception as err:  # noqa: BLE001 - any failure leaves the checked Python path
        warnings.warn(f"packrl: no compiled pack for this layout ({type(err).__name__}: {err}); "
                      "packing stays on the checked Python path", RuntimeWarning, stacklevel=4)
        return None
