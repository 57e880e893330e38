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

``pack_many(samples, rows, first)`` does the same for a list, one kernel call per sample (a
single call over tuples of samples measured no faster: the copies, not the calls, dominate).

The compiled path only accepts, it never explains: anything unexpected (a list where an array
was due, another dtype, a value out of range) makes ``pack`` return False and the caller runs
the checked tree walk, which converts what converts exactly and names what does not. The C
kernel compares dtypes itself, and the Numba kernels have compilation disabled after their
signatures are made, so an array of another dtype is never cast on its way in. String and user
leaves are checked by their codecs in Python and copied by the kernel.
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

from packrl._codegen import import_generated
from packrl.emulation.codecs import LeafCodec

try:
    from packrl.emulation import _fastpack
except ImportError:  # built without a C compiler: the Numba kernel does its work
    _fastpack = None

if TYPE_CHECKING:
    from packrl.emulation.layout import Layout, Node

CHECKED_IN_KERNEL = ("box", "discrete", "multidiscrete", "multibinary")
"""Codec kinds whose check the kernel does itself; other codecs check in Python."""

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
    """The generated pack of one Layout. ``pack(sample, rows, r)`` writes ``sample`` into
    ``rows[r]`` (``rows``: C-contiguous ``(N, nbytes)`` uint8) and returns True, or returns
    False having written nothing. ``pack_many(samples, rows, first)`` packs a list into
    ``rows[first:]`` and returns how many it packed before the first refusal. ``bind(rows, r,
    slow)`` gives ``pack`` for one row as a one-argument function that calls ``slow(sample)``
    on a refusal."""

    def __init__(self, layout: "Layout"):
        source = _Source(layout, fast=fast_kernel_in_use())
        text = source.text()
        # the layout's own description too (its constants derive from it): layouts of other dtypes or
        # codecs can generate the same text, and a module found under the same name keeps the kernels
        # and checks it was made with
        digest = hashlib.sha256(text.encode() + layout._key.encode())
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
        self.bind: Callable[[np.ndarray, int, Callable[[Any], None]], Callable[[Any], None]] = module.bind


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
    """The text of a layout's generated module and the objects it needs."""

    def __init__(self, layout: "Layout", fast: bool):
        self.layout = layout
        self.fast = fast
        self.constants: dict[str, np.ndarray | np.generic] = {}
        self.objects: dict[str, Any] = {}
        self.fields: list[tuple[int, str, bool]] = []  # (leaf id, kernel argument, is a Python scalar)
        self.py_lines: list[str] = []
        self.py_checks: list[str] = []
        self.counter = 0
        self._bound_names: dict[int, tuple | None] = {}
        self._codec_checked: set[int] = set()  # leaves whose codec checks them in Python: no bounds in the kernel

    # ------------------------------------------------------------ the Python half

    def text(self) -> str:
        from packrl.emulation.layout import DictNode, TupleNode

        root = self.layout.root
        self._extract(root, "s", (), DictNode, TupleNode)
        args = ", ".join(expr for _, expr, _ in sorted(self.fields))
        lines = [
            '"""Generated by packrl.emulation.compiled. Do not edit: the file name is a hash of its inputs."""',
            "import numpy as np",
            "",
            "from packrl.emulation.compiled import copy_bytes",
            "",
            "_ndarray = np.ndarray",
            "_int = int",
            "_int64 = np.int64",
            "_asarray = np.asarray",
            "_ready = False",
            "_off = False",
            "",
            "",
            "def pack(s, rows, r):",
            "    if _off:",
            "        return False",
            "    try:",
            *("        " + line for line in self.py_lines or ["pass"]),
            *("        " + line for line in self.py_checks),
            "    except Exception:  # the checked Python path names what is wrong",
            "        return False",
            *self._call_lines("    ", args),
            "    return code == 0",
            "",
            "",
            "def pack_many(samples, rows, first):",
            '    """Pack samples[i] into rows[first + i]; return how many were packed before one was refused."""',
            "    if _off:",
            "        return 0",
            "    i = 0",
            "    for s in samples:",
            "        r = first + i",
            "        try:",
            *("            " + line.replace("return False", "return i") for line in self.py_lines or ["pass"]),
            *("            " + line.replace("return False", "return i") for line in self.py_checks),
            "        except Exception:",
            "            return i",
            *self._call_lines("        ", args),
            "        if code:",
            "            return i",
            "        i += 1",
            "    return i",
            "",
            "",
            "class _Refused(Exception):",
            "    pass",
            "",
            "",
            "def bind(rows, r, slow):",
            '    """``pack`` with ``rows`` and ``r`` fixed, calling ``slow(s)`` where it refuses ``s``: one call',
            '    per sample, for a row that is packed again and again (an env\'s observation row)."""',
            "    def pack_bound(s):",
            "        ok = not _off",
            "        if ok:",
            "            try:",
            *("                " + line.replace("return False", "raise _Refused")
              for line in self.py_lines + self.py_checks or ["pass"]),
            "            except Exception:  # slow(s) runs outside the handler: its error has no context",
            "                ok = False",
            "        if ok:",
            *self._call_lines("            ", args),
            "            ok = code == 0",
            "        if not ok:",
            "            slow(s)",
            "",
            "    return pack_bound",
            "",
            "",
            *([] if self.fast else [*self._kernel_lines(contiguous=True), "", ""]),
            *self._kernel_lines(contiguous=False),
        ]
        return "\n".join(lines) + "\n"

    def _call_lines(self, indent: str, args: str) -> list[str]:
        """Lines that set ``code`` to 0 where the sample was written into ``rows[r]``: the first kernel,
        then the Numba kernel for any memory layout where the first did not take the leaves."""
        if self.fast:  # a negative code: a leaf C does not take (strided, read-only, another dtype)
            lines = [f"code = _fast(_spec, rows, r, {args})",
                     "if code < 0:",
                     f"    code = 0 if _retry_generic(rows, r, {args}) else 1"]
        else:
            lines = ["try:",
                     f"    code = _kernel(rows, r, {args})",
                     "except (TypeError, ValueError, OverflowError):",
                     f"    code = 0 if _retry_generic(rows, r, {args}) else 1"]
        return [indent + line for line in lines]

    def fast_spec(self) -> Any:
        """What ``_fastpack.pack`` checks and where it writes, one entry per kernel argument; the
        bounds are the constants the Numba kernels compare against."""
        leaves = []
        for leaf_id, dtype, shape, scalar in self._kernel_types():
            leaf = self.layout.leaves[leaf_id]
            lo = hi = None
            bounds = self._bounds(leaf_id)
            if bounds is not None:
                lo, hi = (self.constants[name] for name in bounds[:2])
                if not bounds[2]:  # uniform: scalars of the leaf's dtype
                    lo, hi = int(lo), int(hi)
            takes_int = scalar and leaf.kind == "discrete" and dtype == np.int64
            leaves.append((dtype.kind, dtype.itemsize, None if scalar else tuple(shape), leaf.offset, lo, hi,
                           dtype.type if scalar else None, takes_int))
        return _fastpack.make_spec(self.layout.nbytes, tuple(self.layout.gaps), tuple(leaves))

    def _name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _extract(self, node: "Node", expr: str, path: tuple, DictNode: type, TupleNode: type) -> None:
        """Lines that bind each leaf of the sample ``expr`` to a local, checking containers on the way."""
        if type(node) is DictNode:
            lines = self.py_lines
            lines.append(f"if {expr}.__class__ is not dict and not isinstance({expr}, dict): return False")
            lines.append(f"if len({expr}) != {len(node.keys)}: return False")
            for key, child in zip(node.keys, node.children):
                local = self._name("d")
                lines.append(f"{local} = {expr}[{self._const(key)}]")
                self._extract(child, local, path + (key,), DictNode, TupleNode)
        elif type(node) is TupleNode:
            lines = self.py_lines
            lines.append(f"if {expr}.__class__ is not tuple and {expr}.__class__ is not list: return False")
            lines.append(f"if len({expr}) != {len(node.children)}: return False")
            for i, child in enumerate(node.children):
                local = self._name("t")
                lines.append(f"{local} = {expr}[{i}]")
                self._extract(child, local, path + (i,), DictNode, TupleNode)
        else:
            self._leaf(node, expr, path)

    def _leaf(self, node: Any, expr: str, path: tuple) -> None:
        codec, leaf_ids = node.codec, node.leaf_ids
        leaves = [self.layout.leaves[i] for i in leaf_ids]
        dtype = leaves[0].dtype
        # a uint64 Discrete: its int64 scalar argument would meet uint64 bounds in a float comparison
        # a 0-d bool: its scalar argument would be read as a bool, so it is checked by the codec; so is a
        # user's codec that keeps a built-in kind but checks in its own way (register_space)
        own_check = type(codec).check is not getattr(LeafCodec.kinds.get(codec.kind), "check", None)
        in_kernel = (codec.kind in CHECKED_IN_KERNEL and not own_check and len(leaves) == 1 and dtype in _NUMBA_DTYPES
                     and not (codec.kind == "discrete" and dtype == np.uint64)
                     and not (dtype == np.bool_ and leaves[0].shape == ()))
        if in_kernel and leaves[0].shape == () and dtype.kind == "f":
            # a float goes in as a 0-d array: as a scalar argument it would pass through a double,
            # which quietens a float32 signalling NaN
            exact = self._name("_scalar")
            self.objects[exact] = dtype.type
            self.py_checks.append(f"if {expr}.__class__ is {exact}: {expr} = _asarray({expr})")
            self.fields.append((leaf_ids[0], expr, False))
            return
        if in_kernel and leaves[0].shape == ():
            # scalars go in as scalars of an exact class only: Numba would cast a float to an int
            exact = self._name("_scalar")
            self.objects[exact] = leaves[0].dtype.type
            if codec.kind == "discrete":  # a Discrete sample is a Python or NumPy integer
                self.py_checks.append(f"if {expr}.__class__ is not _int and {expr}.__class__ is not _int64 "
                                      f"and {expr}.__class__ is not {exact}: return False")
            else:  # a 0-d array gives its NumPy scalar
                self.py_checks.append(f"if {expr}.__class__ is _ndarray: {expr} = {expr}[()]")
                self.py_checks.append(f"if {expr}.__class__ is not {exact}: return False")
            self.fields.append((leaf_ids[0], expr, True))
            return
        if in_kernel and dtype == np.bool_:  # its bytes (a non-contiguous last axis raises: the checked path)
            self.objects["_uint8"] = np.dtype(np.uint8)
            self.py_checks.append(f"if {expr}.__class__ is _ndarray: {expr} = {expr}.view(_uint8)")
            self.fields.append((leaf_ids[0], expr, False))
            return
        if in_kernel:
            self.fields.append((leaf_ids[0], expr, False))
            return
        # checked in Python by the codec (raises EmulationError on bad input), copied by the kernel
        self._codec_checked.update(leaf_ids)
        check, where = self._name("_check"), self._name("_path")
        self.objects[check], self.objects[where] = codec.check, path
        checked = self._name("c")
        self.py_checks.append(f"{checked} = {check}({expr}, {where})")
        for j, leaf_id in enumerate(leaf_ids):
            bits = _BITS_OF.get(self.layout.leaves[leaf_id].dtype)
            arg = f"{checked}[{j}]"
            if bits is not None:
                dtype = self._name("_bits")
                self.objects[dtype] = bits
                arg = f"{arg}.view({dtype})"
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
            leaf = self.layout.leaves[leaf_id]
            dtype = _BITS_OF.get(leaf.dtype, leaf.dtype)
            out.append((leaf_id, dtype, leaf.shape, scalar))
        return out

    def signature(self, generic: bool) -> tuple:
        sig = [types.Array(types.uint8, 2, "C"), types.intp]
        for leaf_id, dtype, shape, scalar in self._kernel_types():
            nbtype = numba.from_dtype(dtype)
            if scalar:
                leaf = self.layout.leaves[leaf_id]
                sig.append(types.int64 if leaf.kind == "discrete" else numba.from_dtype(dtype))
            elif generic:
                sig.append(types.Array(nbtype, len(shape), "A", readonly=True))
            else:
                sig.append(types.Array(nbtype, len(shape), "C"))
        return tuple(sig)

    def _kernel_lines(self, contiguous: bool) -> list[str]:
        """``_kernel_c_py`` for C-contiguous leaves (flat check loops, which vectorize, and memmoves),
        or ``_kernel_a_py`` for leaves in any memory layout (nested loops)."""
        kinds = self._kernel_types()
        args = [f"a{leaf_id}" for leaf_id, *_ in kinds]
        checks, copies = [], []
        for leaf_id, dtype, shape, scalar in kinds:
            leaf = self.layout.leaves[leaf_id]
            a = f"a{leaf_id}"
            code = leaf_id + 1
            if not scalar and shape:
                checks.append(f"    if {a}.shape != {tuple(shape)!r}:")
                checks.append(f"        return {code}")
            checks += self._range_lines(leaf_id, a, scalar, code, contiguous)
            copies += self._copy_lines(leaf, dtype, a, scalar, contiguous)
        name = "_kernel_c_py" if contiguous else "_kernel_a_py"
        return [f"def {name}(rows, r, " + ", ".join(args) + "):",
                "    # every check before any write: a refused sample leaves the row as it was",
                *checks,
                "    row = rows[r]",
                *copies,
                *(f"    row[{start}:{end}] = 0" for start, end in self.layout.gaps),
                "    return 0"]

    def _bounds(self, leaf_id: int) -> tuple[str, str, bool] | None:
        """Names of the module constants bounding a leaf, and whether they are flat arrays (else scalars)."""
        if leaf_id in self._bound_names:
            return self._bound_names[leaf_id]
        leaf = self.layout.leaves[leaf_id]
        rng = getattr(self._codec_of(leaf), "bounds", None) if leaf.field is None else None
        found = None
        if leaf.kind in CHECKED_IN_KERNEL and rng is not None and rng.integer and rng.needed and leaf_id not in self._codec_checked:
            lo, hi = self._name("_lo"), self._name("_hi")
            dtype = _BITS_OF.get(leaf.dtype, leaf.dtype)
            if leaf.shape == () or rng.uniform is not None:
                low, high = (rng.low[()], rng.high[()]) if leaf.shape == () else rng.uniform
                # NumPy scalars of the leaf's dtype: a mixed signed/unsigned comparison would go through float
                self.constants[lo], self.constants[hi] = dtype.type(low), dtype.type(high)
                found = (lo, hi, False)
            else:
                self.constants[lo], self.constants[hi] = rng.low.reshape(-1).copy(), rng.high.reshape(-1).copy()
                found = (lo, hi, True)
        self._bound_names[leaf_id] = found
        return found

    def _range_lines(self, leaf_id: int, a: str, scalar: bool, code: int, contiguous: bool) -> list[str]:
        bounds = self._bounds(leaf_id)
        if bounds is None:
            return []
        lo, hi, elementwise = bounds
        shape = self.layout.leaves[leaf_id].shape
        if scalar:
            return [f"    if {a} < {lo} or {a} > {hi}:", f"        return {code}"]
        if contiguous or not shape:
            flat = f"{a}.reshape(-1)" if shape else f"{a}.reshape(1)"
            loops, at, inner = [f"    flat = {flat}", "    for k in range(flat.size):"], "k", "        "
            value = "flat[k]"
        else:
            loops, idx = _loops(shape, "    ", a)
            inner = "    " * (len(shape) + 1)
            at = _flat_index(shape)
            value = f"{a}[{idx}]"
        low, high = (f"{lo}[{at}]", f"{hi}[{at}]") if elementwise else (lo, hi)
        # no early exit: the loop stays branch-free and vectorizes
        return ["    bad = False", *loops,
                f"{inner}x = {value}",
                f"{inner}bad |= (x < {low}) | (x > {high})",
                "    if bad:", f"        return {code}"]

    def _copy_lines(self, leaf: Any, dtype: np.dtype, a: str, scalar: bool, contiguous: bool) -> list[str]:
        typed = f"row.view(np.{dtype.name})"
        start = leaf.offset // dtype.itemsize
        if scalar:
            return [f"    {typed}[{start}] = {a}"]
        if not leaf.shape:  # a 0-d array, in any memory layout: its one element's bytes
            return [f"    copy_bytes(row, {leaf.offset}, {a})"]
        dest = self._name("out")
        if contiguous:  # shape and dtype checked, so the bytes are exactly the leaf's
            return [f"    copy_bytes(row, {leaf.offset}, {a})"]
        loops, idx = _loops(leaf.shape, "    ", a)
        inner = "    " * (len(leaf.shape) + 1)
        return [f"    {dest} = {typed}", *loops, f"{inner}{dest}[{start} + {_flat_index(leaf.shape)}] = {a}[{idx}]"]

    def _codec_of(self, leaf: Any) -> Any:
        from packrl.emulation.layout import iter_leaf_nodes

        for _, node in iter_leaf_nodes(self.layout.root):
            if self.layout.leaves[node.leaf_ids[0]] is leaf:
                return node.codec
        raise KeyError(leaf.name)


def _flat_index(shape: tuple) -> str:
    """The C-order flat index of ``i0, i1, ...`` in an array of ``shape``."""
    return " + ".join(f"i{k} * {int(np.prod(shape[k + 1:]))}" for k in range(len(shape)))


def _loops(shape: tuple, indent: str, a: str) -> tuple[list[str], str]:
    """Nested ``for`` lines over the shape of ``a`` (already checked to be ``shape``) and the index
    expression ``i0, i1, ...``. Runtime trip counts: constant ones make LLVM unroll, and compile for seconds."""
    lines = [f"{indent}{'    ' * k}for i{k} in range({a}.shape[{k}]):" for k in range(len(shape))]
    return lines, ", ".join(f"i{k}" for k in range(len(shape)))
