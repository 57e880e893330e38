"""A compiled pack per Layout: one C (or Numba) call checks and writes every leaf of a sample.

The tree walk of ``Layout.pack`` costs one to three microseconds per leaf in Python. For a hot
layout packrl generates a module with two functions that mirror the space's structure:

- ``pack(sample, rows, r)``, plain Python: takes the leaves out of the nested Dicts and Tuples
  and hands them, untouched, to
- ``_fast(_spec, rows, r, *leaves)``, the C extension ``packrl.emulation._fastpack``: it checks
  every leaf's dtype, shape and (for bounded integer leaves) values first, then copies each into
  row ``r`` (one memmove per leaf) and zeroes the row's padding. Nothing is written unless every
  leaf passed. It takes C-contiguous, aligned arrays of exactly the leaf's dtype, and exact scalars.
- Where it is missing (no C compiler at install) or ``PACKRL_PACK_KERNEL=numba``, the same
  kernel compiled by Numba for exactly the leaves' dtypes and ranks, ``_kernel``, takes its place.
- ``_kernel_any``, the Numba kernel with nested loops, is compiled the first time a leaf arrives
  strided, read-only or otherwise not taken by the first.

``pack_many`` calls ``pack`` per sample (one kernel call over tuples of samples measured no
faster: the copies dominate). The text comes from ``packrl._codegen.Code``.

The compiled path only accepts, it never explains: anything unexpected makes ``pack`` return
False (the Packer's checked path then converts or names it). The C kernel compares dtypes itself,
and the Numba kernels have compilation disabled after their signatures are made, so an array of
another dtype is never cast on its way in. String and user leaves are checked by their codecs in
Python and copied by the kernel.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from packrl._codegen import Code, import_generated
from packrl.emulation.tree import DictNode, LeafNode, iter_nodes

try:
    from packrl.emulation import _fastpack
except ImportError:  # built without a C compiler: the Numba kernel does its work
    _fastpack = None

if TYPE_CHECKING:
    from packrl.emulation.packer import Packer

_NUMBA_DTYPES = {np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                        np.uint32, np.uint64, np.float32, np.float64)}
# Numba has no float16 arithmetic; float16 leaves travel as their uint16 bit patterns. Bool leaves
# travel as their bytes, checked against uint8 bounds (the Box's as 0 and 1): a byte of 2 is refused,
# where a bool load would read it as True and the copy would store the 2
_BITS_OF = {np.dtype(np.float16): np.dtype(np.uint16), np.dtype(np.bool_): np.dtype(np.uint8)}


def fast_kernel_in_use() -> bool:
    """Whether new compiled packs check and copy in C (``packrl.emulation._fastpack``) rather than
    in a Numba kernel: the extension was built and ``PACKRL_PACK_KERNEL`` is not ``numba``."""
    mode = os.environ.get("PACKRL_PACK_KERNEL", "auto")
    if mode not in ("auto", "numba"):
        raise ValueError(f"PACKRL_PACK_KERNEL must be 'auto' or 'numba', not {mode!r}")
    return _fastpack is not None and mode == "auto"


class CompiledPack:
    """The generated pack of one layout (given as its ``Packer``). ``pack(sample, rows, r)``
    writes ``sample`` into ``rows[r]`` (``rows``: C-contiguous ``(N, nbytes)`` uint8) and returns
    True, or returns False having written nothing. ``pack_many(samples, rows, first)`` packs a
    list into ``rows[first:]`` and returns how many it packed before the first refusal."""

    def __init__(self, packer: "Packer"):
        source = _Source(packer, fast=fast_kernel_in_use())
        text = source.text()
        # the layout's own description too (its constants derive from it): layouts of other dtypes or
        # codecs can generate the same text, and a module found under the same name keeps the kernels
        # and checks it was made with
        digest = hashlib.sha256(text.encode() + packer.key.encode())
        digest.update(Path(__file__).read_bytes())
        module = import_generated(f"packrl_pack_{digest.hexdigest()[:20]}", text)
        if not getattr(module, "_ready", False):
            for name, value in {**source.constants, **source.objects}.items():
                setattr(module, name, value)
            jit = numba.njit(cache=True, nogil=True, _nrt=False)
            if source.fast:  # the Numba kernels only compile if a leaf arrives that C does not take
                module._fast, module._spec = _fastpack.pack, source.fast_spec()
            else:
                module._kernel = jit(module._kernel_c_py)
                module._kernel.compile(source.signature(generic=False))
                module._kernel.disable_compile()
            module._kernel_any = jit(module._kernel_a_py)
            module._retry_generic = _generic_retry(module, source.signature(generic=True))
            module._ready = True
        self.module = module
        self.pack: Callable[[Any, np.ndarray, int], bool] = module.pack
        self.pack_many: Callable[[list, np.ndarray, int], int] = module.pack_many


@intrinsic
def copy_bytes(typingctx: Any, row: Any, offset: Any, leaf: Any) -> Any:
    """``row[offset:offset + leaf.nbytes] = leaf``'s bytes, for a C-contiguous ``leaf``: one
    ``memmove`` (a flat element loop measured 4x slower on a 10 KB sample; a slice assignment
    needs Numba's runtime for its temporary)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        row_type, _, leaf_type = signature.args
        dst = context.make_array(row_type)(context, builder, args[0])
        src = context.make_array(leaf_type)(context, builder, args[2])
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(leaf_type.dtype)))
        start = builder.gep(builder.bitcast(dst.data, cgutils.voidptr_t), [args[1]])
        cgutils.raw_memmove(builder, start, builder.bitcast(src.data, cgutils.voidptr_t),
                            builder.mul(src.nitems, itemsize), 1)
        return context.get_dummy_value()

    return types.none(row, offset, leaf), codegen


MAX_MISSES = 16
"""Calls with arrays of other dtypes after which a layout's compiled pack turns itself off in this
process: each such call costs Numba tens of microseconds to refuse before the Python path runs."""


def _generic_retry(module: Any, signature: tuple) -> Callable[..., bool]:
    """The fallback for arguments the exact signature refused: compile once for strided and
    read-only arrays and retry; arguments of other dtypes are counted, and after MAX_MISSES of
    them the compiled pack is off (``module._off``)."""
    state = {"compiled": False, "misses": 0}

    def retry(*args: Any) -> bool:
        kernel = module._kernel_any
        if not state["compiled"]:
            state["compiled"] = True
            kernel.disable_compile(False)
            try:
                kernel.compile(signature)
            finally:
                kernel.disable_compile()
        try:
            return kernel(*args) == 0
        except (TypeError, ValueError, OverflowError):
            state["misses"] += 1
            module._off = state["misses"] >= MAX_MISSES
            return False  # not the dtypes the kernel takes: the caller's checked path converts or explains

    return retry


class _Source:
    """The text of a packer's generated module and the objects it needs."""

    def __init__(self, packer: "Packer", fast: bool):
        self.packer = packer
        self.leaves = packer.leaves
        self.fast = fast
        self.constants: dict[str, np.ndarray | np.generic] = {}
        self.objects: dict[str, Any] = {}
        self.fields: list[tuple[int, str, bool]] = []  # (leaf id, kernel argument, is a Python scalar)
        self.py_checks: list[str] = []
        self.counter = 0
        self._bound_names: dict[int, tuple | None] = {}
        self._codec_checked: set[int] = set()  # leaves whose codec checks them in Python: no bounds in the kernel

    # ------------------------------------------------------------ the Python half

    def text(self) -> str:
        extract = Code(depth=2)
        self._extract(extract)
        args = ", ".join(expr for _, expr, _ in sorted(self.fields))
        code = Code()
        code('"""Generated by packrl.emulation.compiled. Do not edit: the file name is a hash of its inputs."""',
             "import numpy as np", "", "from packrl.emulation.compiled import copy_bytes", "",
             "_ndarray = np.ndarray", "_int = int", "_int64 = np.int64", "_asarray = np.asarray",
             "_ready = False", "_off = False", "", "")
        with code.block("def pack(s, rows, r):"):
            with code.block("if _off:"):
                code("return False")
            code("try:")
            code.lines += extract.lines or ["        pass"]
            code("except Exception:  # the checked Python path names what is wrong", "    return False")
            if self.fast:  # a negative code: a leaf C does not take (strided, read-only, another dtype)
                code(f"code = _fast(_spec, rows, r, {args})")
                with code.block("if code < 0:"):
                    code(f"code = 0 if _retry_generic(rows, r, {args}) else 1")
            else:
                code("try:", f"    code = _kernel(rows, r, {args})", "except (TypeError, ValueError, OverflowError):",
                     f"    code = 0 if _retry_generic(rows, r, {args}) else 1")
            code("return code == 0")
        code("", "")
        with code.block("def pack_many(samples, rows, first):"):
            code('"""Pack samples[i] into rows[first + i]; return how many were packed before one was refused."""',
                 "i = 0")
            with code.block("for s in samples:"):
                code("if not pack(s, rows, first + i):", "    return i", "i += 1")
            code("return i")
        code("", "")
        if not self.fast:
            self._kernel(code, contiguous=True)
            code("", "")
        self._kernel(code, contiguous=False)
        return code.text()

    def _extract(self, code: Code) -> None:
        """Lines that bind each leaf of the sample ``s`` to a local (containers checked on the way),
        then the leaves' own checks; any mismatch returns False."""
        local = {(): "s"}
        for path, node in iter_nodes(self.packer.root):
            expr = local[path]
            if type(node) is LeafNode:
                self._leaf(node, expr, path)
                continue
            if type(node) is DictNode:
                code(f"if {expr}.__class__ is not dict and not isinstance({expr}, dict): return False",
                     f"if len({expr}) != {len(node.keys)}: return False")
                keys = node.keys
            else:
                code(f"if {expr}.__class__ is not tuple and {expr}.__class__ is not list: return False",
                     f"if len({expr}) != {len(node.children)}: return False")
                keys = range(len(node.children))
            for key in keys:
                local[path + (key,)] = name = self._name("d" if type(node) is DictNode else "t")
                code(f"{name} = {expr}[{self._const(key)}]")
        code(*self.py_checks)

    def fast_spec(self) -> Any:
        """What ``_fastpack.pack`` checks and where it writes, one entry per kernel argument; the
        bounds are the constants the Numba kernels compare against."""
        leaves = []
        for leaf_id, dtype, shape, scalar in self._kernel_types():
            leaf = self.leaves[leaf_id]
            lo = hi = None
            bounds = self._bounds(leaf_id)
            if bounds is not None:
                lo, hi = (self.constants[name] for name in bounds[:2])
                if not bounds[2]:  # uniform: scalars of the leaf's dtype
                    lo, hi = int(lo), int(hi)
            takes_int = scalar and leaf.codec.takes_python_ints and dtype == np.int64
            leaves.append((dtype.kind, dtype.itemsize, None if scalar else tuple(shape), leaf.offset, lo, hi,
                           dtype.type if scalar else None, takes_int))
        return _fastpack.make_spec(self.packer.nbytes, tuple(self.packer.gaps), tuple(leaves))

    def _name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _leaf(self, node: LeafNode, expr: str, path: tuple) -> None:
        codec, leaf_ids = node.codec, node.leaf_ids
        leaf = self.leaves[leaf_ids[0]]
        dtype = leaf.dtype
        # a uint64 Discrete: its int64 scalar argument would meet uint64 bounds in a float comparison
        # a 0-d bool: its scalar argument would be read as a bool, so it is checked by the codec; so is a
        # codec whose check is more than its bounds (a user's, through register_space)
        in_kernel = (codec.check_is_bounds() and dtype in _NUMBA_DTYPES
                     and not (codec.takes_python_ints and dtype == np.uint64)
                     and not (dtype == np.bool_ and leaf.shape == ()))
        if in_kernel and leaf.shape == ():
            exact = self._name("_scalar")
            self.objects[exact] = dtype.type
        if in_kernel and leaf.shape == () and dtype.kind == "f":
            # a float goes in as a 0-d array: as a scalar argument it would pass through a double,
            # which quietens a float32 signalling NaN
            self.py_checks.append(f"if {expr}.__class__ is {exact}: {expr} = _asarray({expr})")
            self.fields.append((leaf_ids[0], expr, False))
        elif in_kernel and leaf.shape == ():
            # scalars go in as scalars of an exact class only: Numba would cast a float to an int
            if codec.takes_python_ints:  # a Discrete sample is a Python or NumPy integer
                self.py_checks.append(f"if {expr}.__class__ is not _int and {expr}.__class__ is not _int64 "
                                      f"and {expr}.__class__ is not {exact}: return False")
            else:  # a 0-d array gives its NumPy scalar
                self.py_checks.append(f"if {expr}.__class__ is _ndarray: {expr} = {expr}[()]")
                self.py_checks.append(f"if {expr}.__class__ is not {exact}: return False")
            self.fields.append((leaf_ids[0], expr, True))
        elif in_kernel and dtype == np.bool_:  # its bytes (a non-contiguous last axis raises: the checked path)
            self.objects["_uint8"] = np.dtype(np.uint8)
            self.py_checks.append(f"if {expr}.__class__ is _ndarray: {expr} = {expr}.view(_uint8)")
            self.fields.append((leaf_ids[0], expr, False))
        elif in_kernel:
            self.fields.append((leaf_ids[0], expr, False))
        else:  # checked in Python by the codec (raises EmulationError on bad input), copied by the kernel
            self._codec_checked.update(leaf_ids)
            check, where, checked = self._name("_check"), self._name("_path"), self._name("c")
            self.objects[check], self.objects[where] = codec.check, path
            self.py_checks.append(f"{checked} = {check}({expr}, {where})")
            for j, leaf_id in enumerate(leaf_ids):
                bits = _BITS_OF.get(self.leaves[leaf_id].dtype)
                arg = f"{checked}[{j}]"
                if bits is not None:
                    view = self._name("_bits")
                    self.objects[view] = bits
                    arg = f"{arg}.view({view})"
                self.fields.append((leaf_id, arg, False))

    def _const(self, key: Any) -> str:
        if isinstance(key, (str, int, float, bool)) or key is None:
            return repr(key)
        name = self._name("_key")
        self.objects[name] = key
        return name

    # ------------------------------------------------------------ the compiled half

    def _kernel_types(self) -> list[tuple[int, np.dtype, tuple, bool]]:
        """(leaf id, dtype as the kernel sees it, shape, is a scalar argument) per kernel argument."""
        out = []
        for leaf_id, _, scalar in sorted(self.fields):
            leaf = self.leaves[leaf_id]
            out.append((leaf_id, _BITS_OF.get(leaf.dtype, leaf.dtype), leaf.shape, scalar))
        return out

    def signature(self, generic: bool) -> tuple:
        sig = [types.Array(types.uint8, 2, "C"), types.intp]
        for leaf_id, dtype, shape, scalar in self._kernel_types():
            nbtype = numba.from_dtype(dtype)
            if scalar:
                sig.append(types.int64 if self.leaves[leaf_id].codec.takes_python_ints else nbtype)
            elif generic:
                sig.append(types.Array(nbtype, len(shape), "A", readonly=True))
            else:
                sig.append(types.Array(nbtype, len(shape), "C"))
        return tuple(sig)

    def _kernel(self, code: Code, contiguous: bool) -> None:
        """``_kernel_c_py`` for C-contiguous leaves (flat check loops, which vectorize, and memmoves),
        or ``_kernel_a_py`` for leaves in any memory layout (nested loops)."""
        kinds = self._kernel_types()
        args = ", ".join(f"a{leaf_id}" for leaf_id, *_ in kinds)
        with code.block(f"def {'_kernel_c_py' if contiguous else '_kernel_a_py'}(rows, r, {args}):"):
            code("# every check before any write: a refused sample leaves the row as it was")
            for leaf_id, _, shape, scalar in kinds:
                a, refused = f"a{leaf_id}", f"return {leaf_id + 1}"
                if not scalar and shape:
                    with code.block(f"if {a}.shape != {tuple(shape)!r}:"):
                        code(refused)
                self._range_check(code, leaf_id, a, scalar, refused, contiguous)
            code("row = rows[r]")
            for leaf_id, dtype, _, scalar in kinds:
                self._copy(code, self.leaves[leaf_id], dtype, f"a{leaf_id}", scalar, contiguous)
            code(*(f"row[{start}:{end}] = 0" for start, end in self.packer.gaps), "return 0")

    def _bounds(self, leaf_id: int) -> tuple[str, str, bool] | None:
        """Names of the module constants bounding a leaf, and whether they are flat arrays (else scalars)."""
        if leaf_id in self._bound_names:
            return self._bound_names[leaf_id]
        leaf = self.leaves[leaf_id]
        bounds = leaf.bounds
        found = None
        if bounds is not None and bounds.integer and bounds.needed and leaf_id not in self._codec_checked:
            lo, hi = self._name("_lo"), self._name("_hi")
            dtype = _BITS_OF.get(leaf.dtype, leaf.dtype)
            if leaf.shape == () or bounds.uniform is not None:
                low, high = (bounds.low[()], bounds.high[()]) if leaf.shape == () else bounds.uniform
                # NumPy scalars of the leaf's dtype: a mixed signed/unsigned comparison would go through float
                self.constants[lo], self.constants[hi] = dtype.type(low), dtype.type(high)
                found = (lo, hi, False)
            else:
                self.constants[lo], self.constants[hi] = bounds.low.reshape(-1).copy(), bounds.high.reshape(-1).copy()
                found = (lo, hi, True)
        self._bound_names[leaf_id] = found
        return found

    def _range_check(self, code: Code, leaf_id: int, a: str, scalar: bool, refused: str, contiguous: bool) -> None:
        bounds = self._bounds(leaf_id)
        if bounds is None:
            return
        lo, hi, elementwise = bounds
        shape = self.leaves[leaf_id].shape
        if scalar:
            with code.block(f"if {a} < {lo} or {a} > {hi}:"):
                code(refused)
            return
        code("bad = False")  # no early exit: the loop stays branch-free and vectorizes
        if contiguous or not shape:
            code(f"flat = {a}.reshape({'-1' if shape else '1'})")
            sizes, flat_index = ["flat.size"], None
        else:
            sizes, flat_index = [f"{a}.shape[{k}]" for k in range(len(shape))], _flat_index(shape)
        with code.loops(sizes) as idx:
            at = flat_index or idx
            low, high = (f"{lo}[{at}]", f"{hi}[{at}]") if elementwise else (lo, hi)
            code(f"x = {'flat[i0]' if flat_index is None else f'{a}[{idx}]'}", f"bad |= (x < {low}) | (x > {high})")
        with code.block("if bad:"):
            code(refused)

    def _copy(self, code: Code, leaf: Any, dtype: np.dtype, a: str, scalar: bool, contiguous: bool) -> None:
        start = leaf.offset // dtype.itemsize
        if scalar:
            code(f"row.view(np.{dtype.name})[{start}] = {a}")
        elif contiguous or not leaf.shape:  # shape and dtype checked, so the bytes are exactly the leaf's
            code(f"copy_bytes(row, {leaf.offset}, {a})")
        else:
            dest = self._name("out")
            code(f"{dest} = row.view(np.{dtype.name})")
            with code.loops([f"{a}.shape[{k}]" for k in range(len(leaf.shape))]) as idx:
                code(f"{dest}[{start} + {_flat_index(leaf.shape)}] = {a}[{idx}]")


def _flat_index(shape: tuple) -> str:
    """The C-order flat index of ``i0, i1, ...`` in an array of ``shape``. (Loops run to runtime trip
    counts: constant ones make LLVM unroll, and compile for seconds.)"""
    return " + ".join(f"i{k} * {int(np.prod(shape[k + 1:]))}" for k in range(len(shape)))
