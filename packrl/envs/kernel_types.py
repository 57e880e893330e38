"""Namedtuple classes that the generated kernels hand to user kernels (``state``, ``obs``, ``action``).

Numba's disk cache pickles argument types by module and name, so these classes must be found
again in a fresh process: each class is named after its fields (``State_7_physics``) and this
module rebuilds any such name on attribute access.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any

_CLASSES: dict[str, type] = {}


def record(kind: str, fields: tuple[str, ...]) -> type:
    """The namedtuple class ``kind`` with ``fields``, one class per (kind, fields) in every process."""
    name = kind + "".join(f"_{len(f)}_{f}" for f in fields)
    cls = _CLASSES.get(name)
    if cls is None:
        cls = namedtuple(name, fields)
        cls.__module__ = __name__
        _CLASSES[name] = cls
    return cls


def _parse(name: str) -> tuple[str, tuple[str, ...]]:
    kind, _, rest = name.partition("_")
    fields = []
    while rest:
        size, _, rest = rest.partition("_")
        fields.append(rest[: int(size)])
        rest = rest[int(size) + 1:]
    return kind, tuple(fields)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        kind, fields = _parse(name)
        cls = record(kind, fields)
    except (ValueError, TypeError):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    if cls.__name__ != name:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls
