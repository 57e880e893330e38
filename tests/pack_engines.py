"""The two ways a layout packs, for tests that compare them: the compiled pack (the C extension)
and the checked Python path alone, which is what a build without a C compiler has."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from packrl.emulation import compiled

ENGINES = ["c", "python"]
BUILT = compiled._fastpack is not None  # (read at import: a test may hide it)


@contextlib.contextmanager
def engine(name: str) -> Iterator[None]:
    """Layouts made inside pack with ``name``'s engine: "python" hides the C extension from them."""
    assert BUILT, "the C extension should be built"
    with pytest.MonkeyPatch.context() as mp:
        if name == "python":
            mp.setattr(compiled, "_fastpack", None)
        yield


def use_engine(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine(name)`` for the rest of a test."""
    assert BUILT, "the C extension should be built"
    if name == "python":
        monkeypatch.setattr(compiled, "_fastpack", None)
