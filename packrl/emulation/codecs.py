"""Leaf codecs: how each kind of leaf space is stored in a packed row, checked, and read back.

One codec class per leaf space kind, each with its check beside its read-back (as gymnasium's
``spaces/utils.py`` keeps flatten beside unflatten). ``register_space`` teaches the Layout a new
leaf space: map a space type (or its dotted name, so the module need not be imported) to a
function that returns a codec.
"""
from __future__ import annotations

import copy
import functools
import json
import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple

import numpy as np
from gymnasium import spaces

from packrl.emulation.values import Bounds, exact_array, format_path, python_ints, refuse_outside, short
from packrl.errors import EmulationError


@dataclass(frozen=True)
class Field:
    """One typed array a leaf occupies in the row (a string leaf has two: chars and length). A leaf
    of several fields names each (a Python identifier: Numba envs see it as ``obs.<key>_<name>``);
    ``bounds`` (a :class:`Bounds` of the field's dtype and shape) makes the field usable as an action
    and checked in Numba envs; a codec of one field may give its ``bounds`` on the codec instead."""

    name: str | None
    dtype: np.dtype
    shape: tuple
    bounds: Bounds | None = field(default=None, compare=False, repr=False)


class TextView(NamedTuple):
    """A string leaf as views: character indices (padded with zeros) and the length."""

    chars: Any
    length: Any


class LeafCodec(ABC):
    """Base class. Subclasses set ``kind`` (its name in layout JSON) and implement fields, check
    (one exact array per field), view and to_native. The rest of packrl reads a leaf's
    capabilities, never its ``kind``: ``bounds`` (the one :class:`Bounds`; None for strings),
    ``check_is_bounds()``, ``stores_input`` (an input of the field's dtype and shape is stored
    as it is), ``takes_python_ints`` (Discrete), ``categorical`` (each element one of
    ``high - low + 1`` choices from ``low``: embedded; else numeric, scaled by its bounds) and
    ``is_string`` (fields ``chars`` and ``length``, ``vocab`` character codes).

    A leaf may have several fields (``fields``, each with its own dtype, shape and bounds): ``check``
    returns one array per field, ``view`` combines their views into the unpacked form (a tuple of
    them by default), ``to_native`` turns that into the value the space itself produces (what an env
    receives as an action), ``check_column`` checks the leaf of many samples at once (``pack_batch``)."""

    kind: ClassVar[str] = ""
    kinds: ClassVar[dict[str, type["LeafCodec"]]] = {}
    subclass_hint: str = ""  # given by codec_for: the pack paths add it to this codec's refusals (see refused)
    stores_input: ClassVar[bool] = False
    bounds_only: ClassVar[bool] = False  # see check_is_bounds
    takes_python_ints: ClassVar[bool] = False
    categorical: ClassVar[bool] = False
    is_string: ClassVar[bool] = False
    encoders: ClassVar[tuple[str, ...]] = ()  # the built-in encoders its leaves take, the default first; () numeric
    native_is_stored: ClassVar[bool] = False  # see stored_is_native
    vocab: int = 0
    bounds: Bounds | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__ and cls.kind:  # a subclass that keeps its base's kind does not replace it
            LeafCodec.kinds[cls.kind] = cls

    space: spaces.Space
    fields: tuple[Field, ...]

    @abstractmethod
    def spec(self) -> dict:
        """JSON-able parameters that rebuild this codec (``kind`` included)."""

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: dict) -> "LeafCodec":
        """The codec that ``spec()`` describes."""

    @abstractmethod
    def check(self, value: Any, path: tuple, batch: tuple = ()) -> tuple[np.ndarray, ...]:
        """Validate ``value`` (shape ``batch + leaf shape``) and return one exact array per field."""

    def view(self, arrays: tuple) -> Any:
        """The unpacked form of this leaf from its field views: the view itself for one field, else
        the tuple of the views (``nativize`` and ``unpack`` give it; a codec may return a NamedTuple)."""
        return arrays[0] if len(arrays) == 1 else tuple(arrays)

    def field_bounds(self) -> tuple[Bounds | None, ...]:
        """One :class:`Bounds` per field (None: the field is not bounded): ``Field.bounds``, or for a
        codec of one field, its ``bounds``."""
        if len(self.fields) == 1 and self.fields[0].bounds is None:
            return (self.bounds,)
        return tuple(f.bounds for f in self.fields)

    def kernel_names(self, key: str) -> tuple[str, ...]:
        """The names a Numba env's kernels give this leaf's fields (``obs.<name>``), ``key`` being the
        leaf's Dict keys joined by ``_``: the key for one field, ``<key>_<field name>`` for several.
        EmulationError where a kernel cannot write the leaf."""
        return (key,) if len(self.fields) == 1 else tuple(f"{key}_{f.name}" for f in self.fields)

    def check_column(self, column: list, path: tuple) -> tuple[np.ndarray, ...]:
        """The leaf of ``len(column)`` samples (one value each), checked as ``check`` checks one: one
        array per field with a leading samples axis. EmulationError names the sample. This default
        checks each value alone (a codec that stores its input, ``stores_input``, stacks the column
        and checks it once); a codec whose ``check`` takes a batch may override it to check once."""
        n = len(column)
        if self.stores_input:
            return self.check(_stored_column(self, column, path), path, (n,))
        out = tuple(np.zeros((n, *f.shape), f.dtype) for f in self.fields)
        for i, value in enumerate(column):
            try:
                arrays = self.check(value, path)
            except EmulationError as err:
                raise EmulationError(f"sample {i}: {err}") from None
            for column_out, arr in zip(out, arrays):
                column_out[i] = arr
        return out

    def check_is_bounds(self) -> bool:
        """True when ``check`` accepts exactly the arrays of the field's dtype and shape inside
        ``bounds`` (a class that sets ``bounds_only``, and whose ``check`` no subclass replaced)."""
        owner = next(c for c in type(self).__mro__ if "bounds_only" in c.__dict__)
        return owner.bounds_only and type(self).check is owner.check and len(self.fields) == 1

    def stored_is_native(self) -> bool:
        """True when ``to_native`` gives the stored field itself (a NumPy scalar for 0-d integers):
        a class that sets ``native_is_stored`` and whose ``to_native`` no subclass replaced. Only then
        may a compiled action decoder hand its arrays to the env without calling ``to_native``."""
        owner = next(c for c in type(self).__mro__ if "native_is_stored" in c.__dict__)
        return owner.native_is_stored and type(self).to_native is owner.to_native and len(self.fields) == 1

    def to_native(self, unpacked: Any) -> Any:
        """The value the original space would produce (a copy), from the unpacked form."""
        return np.array(unpacked) if len(self.fields) == 1 else tuple(np.array(v) for v in unpacked)

    def rounding_floats(self) -> "LeafCodec":
        """This codec, letting float values be rounded into narrower float fields
        (``Layout.from_space(round_floats=True)``): a new codec where that changes anything."""
        return self

    def refused(self, err: EmulationError) -> EmulationError:
        """A refusal of ``check`` as the pack paths raise it: with ``subclass_hint`` where there is one."""
        return EmulationError(f"{err}; {self.subclass_hint}") if self.subclass_hint else err

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeafCodec) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash(json.dumps(self.spec(), sort_keys=True))


def _stored_column(codec: LeafCodec, column: list, path: tuple) -> np.ndarray:
    """One leaf (one field, stored as given) of many samples as one array, for one ``check``. Where
    the column does not read as one regular numeric array, each sample is checked as ``pack`` checks
    it, so ``pack_batch`` accepts and refuses exactly the samples ``pack`` does, and names the sample."""
    (field_,) = codec.fields
    if not column:
        return np.zeros((0, *field_.shape), field_.dtype)
    arrays = [type(v) is np.ndarray for v in column]
    if any(arrays):
        for i, v in enumerate(column):  # shapes first: np.array of a huge stride-0 view would copy all of it
            if arrays[i] and v.shape != field_.shape:
                raise EmulationError(f"sample {i}: leaf {format_path(path)}: shape {v.shape} does not match the "
                                     f"space's {field_.shape}")
    try:
        arr = np.array(column)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is not None and arr.dtype.kind in "fO" and field_.dtype.kind in "iu" \
            and not any(a and v.dtype == object for a, v in zip(arrays, column)):  # pack refuses object arrays
        # Python ints beyond int64 beside smaller ones read as float64: convert them one by one
        exact = python_ints(column, field_.dtype, (len(column), *field_.shape), path)
        if exact is not None:
            return exact
    if arr is not None and arr.dtype != object:
        return arr
    checked = []  # the column checked sample by sample (as pack checks one), stacked
    for i, value in enumerate(column):
        try:
            checked.append(codec.check(value, path)[0])
        except EmulationError as err:
            raise EmulationError(f"sample {i}: {err}") from None
    return np.stack(checked)


# ---------------------------------------------------------------- registry

SpaceBuilder = Callable[[spaces.Space], LeafCodec]
_BUILDERS: dict[Any, SpaceBuilder] = {}
_BUILTIN_BUILDERS: dict[Any, SpaceBuilder] = {}  # packrl's own (every process has them): they never travel
_TRAVEL_NOTES: list[str] = []  # in a worker: the main process's registrations that did not arrive, and why

TRAVEL_HINT = ("a multiprocessing worker (spawn, forkserver) gets the main process's register_space builders by "
               "their import name: register a class or function defined at the top level of a module (or a "
               "functools.partial of one), not a lambda or a function defined inside another")


def register_space(space_type: type | str, builder: SpaceBuilder) -> None:
    """Teach Layouts a leaf space. ``space_type`` is a class or its dotted name
    (``"minigrid.core.mission.MissionSpace"``); ``builder(space)`` returns a LeafCodec. Vector
    backends that start worker processes send them the builders registered here by reference
    (``registrations()``), so register a top-level class or function of an importable module."""
    _BUILDERS[space_type] = builder


def _class_name(cls: type) -> str:
    """``module.Qualname`` of a class; a main script re-imported in a spawned worker is ``__main__`` too."""
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    return f"{module}.{cls.__qualname__}"


def registrations() -> tuple[tuple[tuple[str, bytes], ...], tuple[str, ...]]:
    """What a worker process needs to build this process's layouts: each builder registered by the
    user (not packrl's own), as (space name, the builder pickled by reference: its import name), and
    a note for each that cannot travel. Only this process's own registrations travel; a layout or
    checkpoint read from a file never names a builder, and reading one imports nothing."""
    items, notes = [], []
    for key, builder in _BUILDERS.items():
        if _BUILTIN_BUILDERS.get(key) is builder:
            continue
        name = key if isinstance(key, str) else _class_name(key)
        try:
            items.append((name, pickle.dumps(builder, protocol=pickle.HIGHEST_PROTOCOL)))
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            notes.append(f"the builder {builder!r} registered for {name} in the main process did not reach this "
                         f"worker: it has no import name ({err})")
    return tuple(items), tuple(notes)


def restore_registrations(travelled: tuple[tuple[tuple[str, bytes], ...], tuple[str, ...]]) -> None:
    """In a worker process: register the main process's builders (``registrations()``), importing
    their modules by name. One that cannot be imported here is noted in the refusal of its space."""
    items, notes = travelled
    notes = list(notes)
    for name, data in items:
        try:
            builder = pickle.loads(data)  # the main process's own registrations, sent to its own worker
        except Exception as err:  # noqa: BLE001 - importing a user's module may raise anything: noted, not fatal
            notes.append(f"the builder registered for {name} in the main process could not be imported in this "
                         f"worker ({type(err).__name__}: {err})")
            continue
        _BUILDERS[name] = builder
    _TRAVEL_NOTES[:] = notes


def codec_for(space: spaces.Space, path: tuple) -> LeafCodec:
    """The codec of a leaf space, found through its class's MRO; EmulationError if none. A
    subclass packed by a base class's codec gets the fix in its refusals: its samples may not be
    what the base class's are (multigrid's MissionSpace is a MultiDiscrete of nvec (1,) whose
    samples have shape ()), and a codec registered for the subclass itself takes them."""
    for cls in type(space).__mro__:
        builder = _BUILDERS.get(cls) or _BUILDERS.get(_class_name(cls))
        if builder is not None:
            codec = builder(space)
            if cls is not type(space):
                sub = type(space)
                codec.subclass_hint = (f"the space is {sub.__module__}.{sub.__qualname__}, packed as its base "
                                          f"class {cls.__qualname__}; if its samples differ from {cls.__qualname__}'s, "
                                          f"register a codec for it: packrl.emulation.register_space("
                                          f"{sub.__qualname__}, builder) (see the README)")
            return codec
    raise EmulationError(f"leaf {format_path(path)}: {_why_unsupported(space)}")


def _why_unsupported(space: spaces.Space) -> str:
    how = ("register a builder with packrl.emulation.register_space(YourSpace, builder) "
           "returning a LeafCodec, or wrap the env so this leaf has a fixed size")
    if isinstance(space, spaces.Sequence):
        return f"{space} has no fixed length, so it cannot be packed into a fixed row; bound it (e.g. a Box plus a length leaf) or {how}"
    if isinstance(space, spaces.Graph):
        return f"{space} has a variable number of nodes and edges; bound it into Box leaves or {how}"
    if isinstance(space, spaces.OneOf):
        return f"{space} is a union whose sample shape varies; split it into a Dict with a Discrete tag or {how}"
    notes = "".join(f"; {note}" for note in _TRAVEL_NOTES)
    return (f"no packrl codec for space {type(space).__module__}.{type(space).__qualname__} ({space}); {how} "
            f"({TRAVEL_HINT}){notes}")


# ---------------------------------------------------------------- spec helpers

def _encode_number(x: Any) -> Any:
    if isinstance(x, (np.integer, int)) and not isinstance(x, bool):
        return int(x)
    x = float(x)
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def encode_array(arr: np.ndarray) -> Any:
    """Compact JSON form of a bound array: a scalar when all entries are equal."""
    arr = np.asarray(arr)
    flat = arr.reshape(-1)
    if flat.size and (np.all(flat == flat[0]) or np.all(np.isnan(flat.astype(float)))):
        return {"fill": _encode_number(flat[0])}
    return {"values": [_encode_number(x) for x in flat]}


def decode_array(obj: dict, dtype: np.dtype, shape: tuple) -> np.ndarray:
    def num(x: Any) -> Any:
        return float(x) if isinstance(x, str) else x
    if "fill" in obj:
        return np.full(shape, num(obj["fill"]), dtype=dtype)
    return np.array([num(x) for x in obj["values"]], dtype=dtype).reshape(shape)


# ---------------------------------------------------------------- Box

class BoxCodec(LeafCodec):
    """Box of any numeric dtype, stored as itself. Integer and bool Boxes are checked against their
    bounds; float Boxes are not (NaN and inf round-trip: observations often overshoot float bounds).
    A bool leaf's bytes are checked as uint8 (``range``: the bounds as 0 and 1), so a non-canonical
    bool (a byte of 2 viewed as bool) is refused too: stored bytes are always 0 or 1."""

    kind = "box"
    stores_input = True
    native_is_stored = True
    bounds_only = True

    def __init__(self, space: spaces.Box, round_floats: bool = False):
        self.space = space
        self.round_floats = bool(round_floats)
        self.dtype = np.dtype(space.dtype)
        self.shape = tuple(space.shape)
        self.fields = (Field(None, self.dtype, self.shape),)
        if self.dtype.kind == "b":  # the bytes, as uint8: bounds and canonical bools in one range
            low, high = (np.asarray(b).astype(np.uint8) for b in (space.low, space.high))
            self.bounds = Bounds(low, high, np.dtype(np.uint8), self.shape)
            self.outside_message = f"is outside the bool Box's bounds (low {short(low.astype(bool).tolist())}, " \
                                   f"high {short(high.astype(bool).tolist())})"
        else:
            self.bounds = Bounds(space.low, space.high, self.dtype, self.shape)
        # float bounds are not checked at pack; integer bounds that span the whole dtype need no check
        self.checked = self.bounds.integer and self.bounds.needed
        if self.checked:
            self.outside_message = f"is outside the Box bounds [{self.space.low.min()}, {self.space.high.max()}]"

    def spec(self) -> dict:
        spec = {"kind": self.kind, "dtype": self.dtype.str, "shape": list(self.shape),
                "low": encode_array(self.space.low), "high": encode_array(self.space.high)}
        if self.round_floats:
            spec["round_floats"] = True
        return spec

    @classmethod
    def from_spec(cls, spec: dict) -> "BoxCodec":
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        low, high = decode_array(spec["low"], dtype, shape), decode_array(spec["high"], dtype, shape)
        return cls(spaces.Box(low=low, high=high, shape=shape, dtype=dtype), spec.get("round_floats", False))

    def rounding_floats(self) -> "BoxCodec":
        if self.round_floats:
            return self
        twin = copy.copy(self)
        twin.round_floats = True
        return twin

    def check(self, value: Any, path: tuple, batch: tuple = ()) -> tuple[np.ndarray, ...]:
        if type(value) is np.ndarray and value.dtype == self.dtype and value.shape == batch + self.shape:
            arr = value
        else:
            arr = exact_array(value, self.dtype, batch + self.shape, path, self.round_floats)
        if self.dtype.kind == "b":
            self._check_bools(arr, path)
        elif self.checked:
            self.bounds.refuse(arr, path, self.outside_message)
        return (arr,)

    def _check_bools(self, arr: np.ndarray, path: tuple) -> None:
        """Every byte 0 or 1, and inside the bounds."""
        raw = arr.view(np.uint8)
        if self.bounds.outside(raw):
            refuse_outside(raw > 1, raw, path, "is the byte of a non-canonical bool (packrl stores bools as 0 or 1)")
            refuse_outside(self.bounds.mask(raw), arr, path, self.outside_message)

    def to_native(self, unpacked: Any) -> Any:
        # as gymnasium's Box.sample: a NumPy scalar for a 0-d integer or bool Box, a 0-d array for a float one
        arr = np.array(unpacked)
        return arr[()] if arr.ndim == 0 and self.dtype.kind in "biu" else arr


# ---------------------------------------------------------------- Discrete

class DiscreteCodec(LeafCodec):
    """Discrete(n, start): the value itself (start included), as int64, shape ()."""

    kind = "discrete"
    stores_input = True
    native_is_stored = True
    bounds_only = True
    takes_python_ints = True
    categorical = True

    def __init__(self, space: spaces.Discrete):
        self.space = space
        self.n, self.start = int(space.n), int(space.start)
        self.dtype = np.dtype(space.dtype)
        self.fields = (Field(None, self.dtype, ()),)
        self.bounds = Bounds(self.start, self.start + self.n - 1, self.dtype, ())
        self._low, self._high = int(self.bounds.low), int(self.bounds.high)
        self.outside_message = f"is outside Discrete(n={self.n}, start={self.start})"

    def spec(self) -> dict:
        return {"kind": self.kind, "n": self.n, "start": self.start, "dtype": self.dtype.str}

    @classmethod
    def from_spec(cls, spec: dict) -> "DiscreteCodec":
        return cls(spaces.Discrete(spec["n"], start=spec["start"], dtype=np.dtype(spec["dtype"])))

    def check(self, value: Any, path: tuple, batch: tuple = ()) -> tuple[np.ndarray, ...]:
        if not batch and type(value) in (int, np.int64) and not isinstance(value, bool):
            if not self._low <= value <= self._high:  # the bounds as Python ints: the commonest sample, fast
                raise EmulationError(f"leaf {format_path(path)}: value {value!r} {self.outside_message} "
                                     f"[{self._low}, {self._high}]")
            return (np.asarray(value, dtype=self.dtype),)
        arr = exact_array(value, self.dtype, batch, path)
        self.bounds.refuse(arr, path, self.outside_message)
        return (arr,)

    def to_native(self, unpacked: Any) -> Any:
        arr = np.array(unpacked)
        return arr[()] if arr.ndim == 0 else arr


# ---------------------------------------------------------------- MultiDiscrete

class MultiDiscreteCodec(LeafCodec):
    """MultiDiscrete(nvec, start) of any nvec shape, stored in its own dtype with start included."""

    kind = "multidiscrete"
    stores_input = True
    native_is_stored = True
    bounds_only = True
    categorical = True

    def __init__(self, space: spaces.MultiDiscrete):
        self.space = space
        self.dtype = np.dtype(space.dtype)
        self.nvec, self.start = np.asarray(space.nvec), np.asarray(space.start)
        self.shape = tuple(self.nvec.shape)
        self.fields = (Field(None, self.dtype, self.shape),)
        self.bounds = Bounds(self.start.astype(object), self.start.astype(object) + self.nvec.astype(object) - 1,
                             self.dtype, self.shape)
        self.outside_message = f"is outside MultiDiscrete(nvec={self.nvec.tolist()}, start={self.start.tolist()})"

    def spec(self) -> dict:
        return {"kind": self.kind, "dtype": self.dtype.str, "shape": list(self.shape),
                "nvec": encode_array(self.nvec), "start": encode_array(self.start)}

    @classmethod
    def from_spec(cls, spec: dict) -> "MultiDiscreteCodec":
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        nvec, start = decode_array(spec["nvec"], dtype, shape), decode_array(spec["start"], dtype, shape)
        return cls(spaces.MultiDiscrete(nvec, dtype=dtype, start=start))

    def check(self, value: Any, path: tuple, batch: tuple = ()) -> tuple[np.ndarray, ...]:
        arr = exact_array(value, self.dtype, batch + self.shape, path)
        self.bounds.refuse(arr, path, self.outside_message)
        return (arr,)


# ---------------------------------------------------------------- MultiBinary

class MultiBinaryCodec(LeafCodec):
    """MultiBinary of any shape, stored as int8 zeros and ones."""

    kind = "multibinary"
    stores_input = True
    native_is_stored = True
    bounds_only = True

    def __init__(self, space: spaces.MultiBinary):
        self.space = space
        self.dtype = np.dtype(space.dtype)
        self.shape = tuple(space.shape)
        self.fields = (Field(None, self.dtype, self.shape),)
        self.bounds = Bounds(0, 1, self.dtype, self.shape)

    def spec(self) -> dict:
        return {"kind": self.kind, "shape": list(self.shape)}

    @classmethod
    def from_spec(cls, spec: dict) -> "MultiBinaryCodec":
        return cls(spaces.MultiBinary(spec["shape"]))

    def check(self, value: Any, path: tuple, batch: tuple = ()) -> tuple[np.ndarray, ...]:
        arr = exact_array(value, self.dtype, batch + self.shape, path)
        self.bounds.refuse(arr, path, "is not 0 or 1 (MultiBinary)")
        return (arr,)


# ---------------------------------------------------------------- strings

def _index_dtype(count: int) -> np.dtype:
    return np.dtype(np.uint8 if count <= 256 else np.uint16 if count <= 65536 else np.uint32)


class _StringCodec(LeafCodec):
    """Shared storage of string leaves: ``chars`` (max_length,) padded with zeros, ``length`` int32."""

    is_string = True
    encoders = ("words", "embedding")  # bags of hashed words and word pairs; characters embedded and mean-pooled

    max_length: int
    min_length: int = 0
    char_dtype: np.dtype

    def _fields(self) -> tuple[Field, ...]:
        return (Field("chars", self.char_dtype, (self.max_length,)), Field("length", np.dtype(np.int32), ()))

    @abstractmethod
    def encode_string(self, text: Any, path: tuple) -> Any:
        """The codes of one string (refusing what the space cannot hold)."""

    @abstractmethod
    def decode_string(self, codes: np.ndarray) -> str:
        """The string of ``codes``."""

    def check(self, value: Any, path: tuple, batch: tuple = ()) -> tuple[np.ndarray, ...]:
        values = np.empty(batch, dtype=object)
        if batch:
            try:
                values[...] = value if not isinstance(value, np.ndarray) else value.astype(object)
            except ValueError:
                raise EmulationError(f"leaf {format_path(path)}: expected {batch} strings, got {value!r}") from None
        else:
            values[()] = value
        chars = np.zeros(batch + (self.max_length,), dtype=self.char_dtype)
        lengths = np.zeros(batch, dtype=np.int32)
        for idx in np.ndindex(*batch):
            codes = self.encode_string(values[idx], path)
            if not self.min_length <= len(codes) <= self.max_length:
                raise EmulationError(
                    f"leaf {format_path(path)}: string {values[idx]!r} has length {len(codes)}, outside "
                    f"[{self.min_length}, {self.max_length}]; packrl never cuts strings (raise the bound)")
            chars[idx][: len(codes)] = codes
            lengths[idx] = len(codes)
        return (chars, lengths)

    def kernel_names(self, key: str) -> tuple[str, ...]:
        raise EmulationError("is a string; Numba envs take numeric leaves only")

    def check_column(self, column: list, path: tuple) -> tuple[np.ndarray, ...]:
        values = np.empty(len(column), dtype=object)
        values[:] = column
        return self.check(values, path, (len(column),))

    def view(self, arrays: tuple) -> TextView:
        return TextView(*arrays)

    def to_native(self, unpacked: TextView) -> Any:
        chars, lengths = np.asarray(unpacked.chars), np.asarray(unpacked.length)
        if lengths.ndim == 0:
            return self.decode_string(chars[: int(lengths)])
        out = np.empty(lengths.shape, dtype=object)
        for idx in np.ndindex(*lengths.shape):
            out[idx] = self.decode_string(chars[idx][: int(lengths[idx])])
        return out


class TextCodec(_StringCodec):
    """gymnasium Text: indices into the space's charset plus the length."""

    kind = "text"

    def __init__(self, space: spaces.Text):
        self.space = space
        self.max_length, self.min_length = int(space.max_length), int(space.min_length)
        self.charset = "".join(space.character_list)
        self.index = {c: i for i, c in enumerate(self.charset)}
        self.char_dtype = _index_dtype(len(self.charset))
        self.vocab = len(self.charset)
        self.fields = self._fields()

    def spec(self) -> dict:
        return {"kind": self.kind, "max_length": self.max_length, "min_length": self.min_length, "charset": self.charset}

    @classmethod
    def from_spec(cls, spec: dict) -> "TextCodec":
        return cls(spaces.Text(spec["max_length"], min_length=spec["min_length"], charset=spec["charset"]))

    def encode_string(self, text: Any, path: tuple) -> list[int]:
        if not isinstance(text, str):
            raise EmulationError(f"leaf {format_path(path)}: expected a str, got {type(text).__name__} {text!r}")
        try:
            return [self.index[c] for c in text]
        except KeyError as err:
            raise EmulationError(f"leaf {format_path(path)}: character {err.args[0]!r} of {text!r} is not in the Text charset") from None

    def decode_string(self, codes: np.ndarray) -> str:
        return "".join(self.charset[int(i)] for i in codes)


class BoundedString(spaces.Space):
    """A string leaf of at most ``max_length`` UTF-8 bytes (packrl's stand-in for MiniGrid's MissionSpace)."""

    def __init__(self, max_length: int = 256):
        super().__init__(shape=None, dtype=None)
        self.max_length = int(max_length)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x.encode("utf-8")) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, self.max_length + 1))
        return "".join(chr(c) for c in self.np_random.integers(32, 127, size=n))

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"BoundedString({self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BoundedString) and other.max_length == self.max_length


class BoundedStringCodec(_StringCodec):
    """Any string space stored as UTF-8 bytes, at most ``max_length`` of them; longer strings are refused."""

    kind = "bounded_string"
    char_dtype = np.dtype(np.uint8)
    vocab = 256

    def __init__(self, space: spaces.Space, max_length: int):
        self.space = space
        self.max_length = int(max_length)
        self.fields = self._fields()

    def spec(self) -> dict:
        return {"kind": self.kind, "max_length": self.max_length}

    @classmethod
    def from_spec(cls, spec: dict) -> "BoundedStringCodec":
        return cls(BoundedString(spec["max_length"]), spec["max_length"])

    def encode_string(self, text: Any, path: tuple) -> np.ndarray:
        if not isinstance(text, str):
            raise EmulationError(f"leaf {format_path(path)}: expected a str, got {type(text).__name__} {text!r}")
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode_string(self, codes: np.ndarray) -> str:
        return bytes(np.asarray(codes, dtype=np.uint8)).decode("utf-8")


MISSION_MAX_BYTES = 256
"""Default bound of MiniGrid/BabyAI mission strings, in UTF-8 bytes (the longest BabyAI missions are ~200)."""


def _bounded_string_codec(space: spaces.Space, max_length: int) -> BoundedStringCodec:
    return BoundedStringCodec(space, space.max_length if isinstance(space, BoundedString) else max_length)


def bounded_string(max_length: int = MISSION_MAX_BYTES) -> SpaceBuilder:
    """A builder for ``register_space`` that stores a string space in at most ``max_length`` bytes
    (a ``functools.partial``: it reaches worker processes by name)."""
    return functools.partial(_bounded_string_codec, max_length=int(max_length))


_BUILTIN_BUILDERS.update({
    spaces.Box: BoxCodec,
    spaces.Discrete: DiscreteCodec,
    spaces.MultiDiscrete: MultiDiscreteCodec,
    spaces.MultiBinary: MultiBinaryCodec,
    spaces.Text: TextCodec,
    BoundedString: bounded_string(),
    "minigrid.core.mission.MissionSpace": bounded_string(MISSION_MAX_BYTES),
})
_BUILDERS.update(_BUILTIN_BUILDERS)
