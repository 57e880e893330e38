"""Generated Python modules: the one code emitter (``Code``) and the files on disk, so that Numba's
``cache=True`` can keep their compiled code.

Numba caches a function by its source file and that file's modification time, so generated code
is written once to a file named by a hash of everything that shapes it, and imported from there.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Sequence

from packrl.run_folders import write_file


def cache_dir() -> Path:
    """Where generated kernel modules (and Numba's cache of them) live."""
    return Path(os.environ.get("PACKRL_NUMBA_CACHE", Path.home() / ".cache" / "packrl" / "numba"))


def import_generated(modname: str, text: str) -> ModuleType:
    """Import the module ``modname`` with source ``text``, writing its file first if it is new.

    ``modname`` must name ``text`` uniquely (a hash of it): an existing file is never rewritten."""
    if modname in sys.modules:
        return sys.modules[modname]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{modname}.py"
    if not path.exists():
        # an unpredictable temporary name, made exclusively and renamed: processes starting together never read
        # half a file, and a symlink planted at a temporary name is never written through
        write_file(folder, path.name, text)
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[modname]
        raise
    return module


class Code:
    """Lines of generated Python. ``code(line, ...)`` adds lines at the current indentation;
    ``with code.block("if x:"):`` indents what it holds under its header; ``with code.loops(sizes)
    as index:`` nests one ``for`` per size (``i0``, ``i1``, ... or another ``var``) and gives the
    index expression ``"i0, i1"``."""

    def __init__(self, depth: int = 0):
        self.lines: list[str] = []
        self.depth = depth

    def __call__(self, *lines: str) -> None:
        self.lines += [("    " * self.depth + line) if line else "" for line in lines]

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        self(header)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    @contextmanager
    def loops(self, sizes: Sequence[Any], var: str = "i") -> Iterator[str]:
        names = [f"{var}{k}" for k in range(len(sizes))]
        for name, size in zip(names, sizes):
            self(f"for {name} in range({size}):")
            self.depth += 1
        try:
            yield ", ".join(names)
        finally:
            self.depth -= len(sizes)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
