"""One block of memory for every array a vector env shares with its workers.

A ``BufferPlan`` names each array (shape, dtype) and gives it a 64-byte aligned offset, so
the main process and every worker see the same zero-copy numpy views of one segment.
"""
from __future__ import annotations

import _posixshmem
import mmap
import os
import secrets
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any

import numpy as np

ALIGN = 64  # a cache line: rows written by different workers never share one at their edges


@dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple
    dtype: str
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class BufferPlan:
    """Where each named array lives in the segment. Plain data: it pickles to workers."""

    specs: tuple[ArraySpec, ...]
    nbytes: int

    @classmethod
    def build(cls, arrays: dict[str, tuple[tuple, Any]]) -> "BufferPlan":
        specs, offset = [], 0
        for name, (shape, dtype) in arrays.items():
            spec = ArraySpec(name, tuple(int(s) for s in shape), np.dtype(dtype).str, offset)
            specs.append(spec)
            offset += -(-spec.nbytes // ALIGN) * ALIGN
        return cls(tuple(specs), max(offset, ALIGN))

    def views(self, buf: Any) -> dict[str, np.ndarray]:
        """Numpy views of every array over ``buf`` (a memoryview, mmap or bytearray); no copy."""
        out = {}
        for s in self.specs:
            count = int(np.prod(s.shape, dtype=np.int64))
            out[s.name] = np.frombuffer(buf, dtype=s.dtype, count=count, offset=s.offset).reshape(s.shape)
        return out

    def local(self) -> dict[str, np.ndarray]:
        """The same arrays in private memory (the serial backend)."""
        return self.views(bytearray(self.nbytes))


class Segment:
    """A new POSIX shared-memory segment named ``packrl_<random>``, mapped here.

    The owner unlinks it as soon as every worker mapped it, so a crash later cannot leave it in
    /dev/shm; until then the resource tracker removes it if this process dies. Unlike
    ``SharedMemory`` it never closes the mapping under numpy views (the mapping lives as long
    as the last view)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.name = f"packrl_{secrets.token_hex(8)}"
        fd = _posixshmem.shm_open("/" + self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, nbytes)
            self.buf = mmap.mmap(fd, nbytes)
        except BaseException:
            _posixshmem.shm_unlink("/" + self.name)
            raise
        finally:
            os.close(fd)
        resource_tracker.register("/" + self.name, "shared_memory")
        self.linked = True

    def unlink(self) -> None:
        """Remove the name (idempotent); the memory stays mapped wherever it is mapped."""
        if self.linked:
            self.linked = False
            _posixshmem.shm_unlink("/" + self.name)
            resource_tracker.unregister("/" + self.name, "shared_memory")


def attach_segment(name: str, nbytes: int) -> Any:
    """Map an existing segment in a worker.

    ``SharedMemory(name)`` would register the segment with the resource tracker again (Python
    < 3.13), which then warns or unlinks it behind the owner's back; mapping it directly leaves
    the owner in sole charge of its lifetime."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
