"""CUDA graphs of a rollout driver's policy steps (``PPOConfig.cuda_graphs``, off by default until a GPU run shows
the graph rollout bit-equal to the eager one and at least as fast).

``StepGraphs.steps`` takes the driver's eager per-step callables (each reads and writes its own slots of storage)
and returns them captured as CUDA graphs that share one memory pool and replay in the order they were captured.
A capture that fails falls back to the eager steps with one warning, and is not tried again.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from packrl.train.rollout import PolicyStep

Step = Callable[[], None]


def graphs_wanted(device: torch.device, asked: bool, has_spec: bool, policy: nn.Module) -> bool:
    """Graphs for the rollout: on CUDA, with packrl's decoder, when asked (``cuda_graphs``) and every module of the
    policy is graph-safe (``WordEncoder`` reads string lengths on the host: not)."""
    return (device.type == "cuda" and asked and has_spec
            and all(getattr(m, "graph_safe", True) for m in policy.modules()))


def capture(steps: list[Step], step: PolicyStep) -> list[Step]:
    """One CUDA graph per callable of ``steps``. The warm-up runs on a side stream, as torch's CUDA-graph notes
    require, and the recurrent state it stepped is put back (the state is held in place from here on)."""
    device = step.device
    saved = step.hold_state_in_place()
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                steps[0]()
        torch.cuda.current_stream(device).wait_stream(side)
        graphs, pool = [], None
        for each in steps:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                each()
            pool = graph.pool() if pool is None else pool
            graphs.append(graph)
    finally:
        for held, value in zip(step.state, saved):
            held.copy_(value)
    return [graph.replay for graph in graphs]


class StepGraphs:
    """A driver's steps as CUDA graphs, captured on first use when ``wanted``; the eager steps otherwise."""

    def __init__(self, wanted: bool):
        self.wanted = wanted
        self.replays: list[Step] | None = None

    @property
    def captured(self) -> bool:
        return self.replays is not None

    def steps(self, eager: list[Step], step: PolicyStep) -> list[Step]:
        """The callables a rollout runs: the graph replays once captured (captured here on the first call)."""
        if self.wanted and self.replays is None:
            self.wanted = False  # one try: a failed capture falls back for the rest of the run
            try:
                self.replays = capture(eager, step)
            except Exception as error:  # noqa: BLE001 - any capture failure falls back to the eager step
                warnings.warn(f"CUDA-graph capture of the rollout failed ({type(error).__name__}: {error}); "
                              "the rollout runs its eager steps", RuntimeWarning, stacklevel=2)
        return self.replays if self.replays is not None else eager
