"""Data-parallel PPO over ``torch.distributed`` (``torchrun``): every rank steps its own envs, starts from
rank 0's weights and averages its gradients with the other ranks' before each optimizer step.

``join`` is how ``packrl train`` becomes one run under torchrun: it reads torchrun's variables, initialises the
process group (gloo for CPU tensors; with CUDA, ``cpu:gloo,cuda:nccl`` so the gradients go over NCCL) with a
timeout on every collective, and learns every rank's host and pid, so that a rank that dies can be named by the
ranks that are left (``Group.lost``). What crosses between ranks here is bytes of plain text and numbers in
tensors: nothing is unpickled.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from packrl.checkpoint import pid_exists
from packrl.errors import ConfigError, PackrlError

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
"""Set by torchrun for each worker; all four present means ``packrl train`` runs as one rank of a run."""
DEFAULT_TIMEOUT_S = 60.0
"""Seconds a collective waits for the other ranks before it fails (a rank that died or hangs)."""


class LostRankError(PackrlError, RuntimeError):
    """A collective failed: another rank died, hung past the timeout, or closed its connection. The message
    names the ranks this rank found gone (``lost``) when it could tell."""

    def __init__(self, message: str, lost: list[int]):
        super().__init__(message)
        self.lost = lost


class DivergedError(PackrlError, RuntimeError):
    """The ranks' weights differ at a checkpoint (they must be bit-identical: same start, averaged gradients)."""


def rank_and_world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when no process group is initialised."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def broadcast_parameters(module: nn.Module) -> None:
    """Every rank takes rank 0's weights (and buffers)."""
    for tensor in module.state_dict().values():
        dist.broadcast(tensor.data, src=0)


def average_gradients(params: list[torch.Tensor]) -> None:
    """One all-reduce over all gradients flattened together (DDP's effect, without wrapping the policy:
    PPO calls ``forward_eval`` and ``forward``, which DDP's hooks on ``__call__`` would miss)."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def all_sum(value: int, device: torch.device) -> int:
    """``value`` summed over ranks (on the GPU for NCCL, which has no CPU tensors)."""
    t = torch.tensor([value], dtype=torch.int64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return int(t.item())


# ---------------------------------------------------------------- one run under torchrun


def launched_by_torchrun() -> bool:
    """True when torchrun started this process (its variables are all set)."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s sampling generators (torch, NumPy, Python): rank 0 keeps the run's seed, so
    a one-process run and rank 0 of a data-parallel run draw alike."""
    return seed + rank


def env_seed(seed: int, rank: int, world: int, num_envs: int, iteration: int = 0) -> int:
    """The seed of env 0 of rank ``rank`` when its envs are reset at ``iteration`` (``PPO.reset_envs``: env i
    gets this plus i), so no two ranks' envs share a seed."""
    return seed + (iteration * world + rank) * num_envs


@dataclass
class Group:
    """This process's place in a data-parallel run: ``rank`` of ``world``, the collective ``timeout_s``, and
    each rank's ``(host, pid)``. ``owned``: this group was initialised here (``close`` destroys it)."""

    rank: int
    world: int
    backend: str
    timeout_s: float
    owned: bool
    peers: list[tuple[str, int]] = field(default_factory=list)
    stopping: list[int] = field(default_factory=list)  # the ranks whose signal stopped the run

    @property
    def main(self) -> bool:
        return self.rank == 0

    def close(self) -> None:
        """Destroy the process group if it was made here (every exit path calls this)."""
        if self.owned and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except (RuntimeError, ValueError):  # a group broken by a lost rank: nothing left to release cleanly
                pass

    # -------------------------------------------------- collectives on CPU tensors (gloo)

    def broadcast_text(self, text: str | None) -> str:
        """Rank 0's ``text`` on every rank (UTF-8 bytes in a uint8 tensor: a string, never an object)."""
        data = (text or "").encode() if self.main else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(size, src=0)
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if self.main and data else \
            torch.zeros(int(size.item()), dtype=torch.uint8)
        if int(size.item()):
            dist.broadcast(buffer, src=0)
        return bytes(buffer.numpy()).decode()

    def gather_text(self, text: str) -> list[str]:
        """Every rank's ``text``, in rank order, on every rank."""
        data = text.encode()
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
        parts = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world)]
        if longest:
            dist.all_gather(parts, mine)
        return [bytes(p[:int(s.item())].numpy()).decode() for p, s in zip(parts, sizes)]

    def sum(self, values: list[float]) -> list[float]:
        """``values`` summed over ranks, element by element, in float64 (exact for integers below 2**53)."""
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def barrier(self) -> None:
        """Wait for every rank (an all-reduce, which gloo and NCCL both bound by the timeout)."""
        self.sum([0.0])

    # -------------------------------------------------- checks

    def check_identical(self, module: nn.Module, where: str) -> list[str]:
        """Every rank's ``weights_digest`` of ``module``; DivergedError naming the ranks whose weights differ
        from rank 0's (the same error on every rank)."""
        digests = self.gather_text(weights_digest(module))
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        if differ:
            raise DivergedError(f"{where}: the weights of rank{'s' if len(differ) > 1 else ''} "
                                f"{', '.join(map(str, differ))} differ from rank 0's (sha256 "
                                f"{digests[differ[0]][:12]} against {digests[0][:12]}); the ranks must hold the "
                                "same weights")
        return digests

    def on_ranks(self, ranks: list[int]) -> str:
        """`` on rank 1`` / `` on ranks 0, 2``: which ranks a signal reached (said of a run of several)."""
        return f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""

    @property
    def resume_command(self) -> str:
        """How to continue this run, before ``--resume RUN``."""
        return f"the same torchrun command ({self.world} ranks) with"

    def collective_error(self, error: BaseException) -> bool:
        """Whether ``error`` is a collective that failed (a rank lost or silent)."""
        return is_collective_error(error)

    def checkpoint_fields(self, ppo: Any, num_envs: int) -> dict:
        """The ``distributed`` metadata of a checkpoint (collectives: every rank calls this at the same
        iteration): world size, backend, per-rank seeds, weight digests (proved identical) and each other
        rank's training state for ``--resume``."""
        digests = self.check_identical(ppo.policy, f"iteration {ppo.iteration} (step {ppo.global_step:,})")
        states = self.gather_text(json.dumps(ppo.training_state()))
        seed = ppo.config.seed
        return {"distributed": {
            "world_size": self.world, "backend": self.backend,
            "rank_seeds": [rank_seed(seed, r) for r in range(self.world)],
            "env_seeds": [env_seed(seed, r, self.world, num_envs, ppo.iteration) for r in range(self.world)],
            "weights_sha256": digests,
            "resume_by_rank": [None] + [json.loads(text) for text in states[1:]],  # rank 0's is ``resume``
        }}

    def lost(self, error: BaseException) -> LostRankError:
        """What a failed collective means, as one line: the ranks on this host whose process has exited (a
        rank on another host cannot be checked from here), and the backend's own words."""
        host = socket.gethostname()
        local = [r for r, (h, _) in enumerate(self.peers) if r != self.rank and h == host]
        deadline = time.monotonic() + 2.0  # a killed process closes its sockets a moment before it is gone
        while True:
            gone = [r for r in local if not _alive(self.peers[r][1])]
            if gone or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        elsewhere = [r for r, (h, _) in enumerate(self.peers) if h != host]
        what = " ".join(str(error).split())[:300]
        if gone:
            who = f"lost rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} (pid " + \
                  ", ".join(str(self.peers[r][1]) for r in gone) + " on this host has exited)"
        else:
            who = "lost contact with the other ranks (none on this host has exited" + \
                  (f"; ranks {', '.join(map(str, elsewhere))} run on other hosts" if elsewhere else "") + \
                  f"; a rank may hang: collectives wait {self.timeout_s:g} s)"
        return LostRankError(f"rank {self.rank}: {who}; the collective failed: {what}", gone)


class SingleProcess(Group):
    """The one-process form of a ``Group``: rank 0 of 1, whose collectives give back what they are given, so
    the run is the same code with one rank or many. Its checkpoints record no ``distributed`` field."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__(0, 1, "none", timeout_s, False, [(socket.gethostname(), os.getpid())])

    def close(self) -> None:
        pass

    def broadcast_text(self, text: str | None) -> str:
        return text or ""

    def gather_text(self, text: str) -> list[str]:
        return [text]

    def sum(self, values: list[float]) -> list[float]:
        return [float(v) for v in values]

    def on_ranks(self, ranks: list[int]) -> str:
        return ""

    @property
    def resume_command(self) -> str:
        return "packrl train"

    def collective_error(self, error: BaseException) -> bool:
        return False  # no collective runs: a RuntimeError here is the run's own

    def checkpoint_fields(self, ppo: Any, num_envs: int) -> dict:
        return {}


def join(timeout_s: float = DEFAULT_TIMEOUT_S) -> Group:
    """The data-parallel group of this process: one already initialised by the caller (kept open), else, under
    torchrun with more than one rank, a new one (gloo; ``cpu:gloo,cuda:nccl`` when CUDA is present, with each
    rank on GPU ``LOCAL_RANK``); ``SingleProcess`` for a single process. ConfigError names a torchrun variable
    that is not an integer."""
    if timeout_s <= 0:
        raise ConfigError(f"--collective-timeout {timeout_s:g}: give a positive number of seconds")
    owned = False
    if not dist.is_initialized():
        if not launched_by_torchrun():
            return SingleProcess(timeout_s)
        rank, world, local_rank = (_int_variable(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        if world <= 1:
            return SingleProcess(timeout_s)
        if not 0 <= rank < world:
            raise ConfigError(f"RANK={rank} is outside 0..{world - 1} (WORLD_SIZE={world})")
        backend = "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            backend = "cpu:gloo,cuda:nccl"  # collectives go by the tensor's device: bytes on gloo, gradients on NCCL
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        owned = True
    rank, world = rank_and_world()
    group = Group(rank, world, str(dist.get_backend()), timeout_s, owned)
    try:
        peers = group.gather_text(f"{socket.gethostname()} {os.getpid()}")
        group.peers = [(host, int(pid)) for host, pid in (p.rsplit(" ", 1) for p in peers)]
    except BaseException:
        group.close()
        raise
    return group


def weights_digest(module: nn.Module) -> str:
    """``state_digest`` of the module's parameters and buffers. Equal digests: bit-identical weights."""
    return state_digest(module.state_dict())


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over a state dict by sorted name: each name, dtype, shape and raw bytes (a checkpoint's policy
    tensors give the digest of the module they were saved from)."""
    h = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def is_collective_error(error: BaseException) -> bool:
    """Whether ``error`` came from a collective with a peer gone or silent (gloo raises a plain RuntimeError)."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        word in text for word in ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "Timed out",
                                  "timed out", "Broken pipe", "ProcessGroup"))


def _int_variable(name: str) -> int:
    text = os.environ[name]
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} (set by torchrun) is not an integer") from None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped by torchrun, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:  # no /proc (not Linux): ask the kernel
        return pid_exists(pid)
