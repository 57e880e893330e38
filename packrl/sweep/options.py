"""What a sweep is asked to do, readable without Optuna (``packrl sweep``'s flags are checked against it before
Optuna is imported): the samplers, the pruners, the options and the error of a sweep that cannot start."""
from __future__ import annotations

from dataclasses import dataclass, field

from packrl.errors import ConfigError
from packrl.sweep.objective import Objective
from packrl.sweep.space import Space

SAMPLERS = ("tpe", "cmaes", "random")
PRUNERS = ("median", "hyperband", "none")


class SweepError(ConfigError):
    """A sweep that cannot start: a study under another space or objective, a folder in use, a bad budget."""


@dataclass
class SweepOptions:
    env: str
    trials: int = 20
    budget: int = 50_000
    jobs: int = 1
    space: Space | None = None
    storage: str | None = None
    study: str | None = None
    sampler: str = "tpe"
    pruner: str = "median"
    objective: Objective | None = None
    seed: int = 0
    out: str | None = None
    live: bool = True
    base: dict = field(default_factory=dict)  # the resolved config every trial starts from
