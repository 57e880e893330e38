"""The one torch thread policy of every packrl command and sweep trial (a module of its own: ``packrl.commands``
and ``packrl.sweep`` both use it, and neither may import the other)."""
from __future__ import annotations

import os


def apply_torch_threads(threads: int | None) -> None:
    """One torch intra-op thread unless asked (``threads``, or OMP_NUM_THREADS when set): ``packrl train``,
    ``eval``, ``check`` and sweep trials alike. On the 2-core project machine with other jobs running, 20k
    gridworld steps took 16.0-17.1 s on one thread and 14.4-41.7 s on two (interleaved rounds), and 170 s on two
    beside one busy process; an eval took 1,067 s with torch's default threads and 56 s on one (issue 41): torch's
    threads wait for each other."""
    import torch

    if threads is None and os.environ.get("OMP_NUM_THREADS"):
        return
    torch.set_num_threads(threads or 1)
