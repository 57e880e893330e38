"""The autoreset modes of packrl's vector envs, by gymnasium's names (``gymnasium.vector.AutoresetMode``).

- ``SAME_STEP`` (the default): on the step an episode ends, ``observations`` holds the next
  episode's first observation and ``final_observations`` the ended one's last.
- ``NEXT_STEP``: the step an episode ends returns its last observation; the env's next step
  resets it instead of stepping (its action is ignored) and returns the first observation with
  reward 0 and both flags false. gymnasium's observation wrappers need this mode.
- ``DISABLED``: nothing resets by itself; ``reset(options={"reset_mask": mask})`` resets the envs
  of ``mask``, and stepping an env whose episode ended without that reset is refused.
"""
from __future__ import annotations

from typing import Any

from packrl.env_protocol import SAME_STEP
from packrl.errors import UsageError

try:  # gymnasium >= 1.1 names the autoreset modes
    from gymnasium.vector import AutoresetMode

    NEXT_STEP: Any = AutoresetMode.NEXT_STEP
    DISABLED: Any = AutoresetMode.DISABLED
except ImportError:  # pragma: no cover - gymnasium 1.0
    NEXT_STEP, DISABLED = "NextStep", "Disabled"

MODES = {"SAME_STEP": SAME_STEP, "NEXT_STEP": NEXT_STEP, "DISABLED": DISABLED}
WORKER_BACKENDS = ("serial", "multiprocessing")  # the backends whose env runner knows every mode


def check_mode(mode: Any) -> Any:
    """gymnasium's ``AutoresetMode`` member for ``mode``: a member, its name (``"NEXT_STEP"``) or its
    value (``"NextStep"``)."""
    for name, member in MODES.items():
        if mode == member or (isinstance(mode, str) and mode in (name, getattr(member, "value", member))):
            return member
    raise UsageError(f"autoreset_mode={mode!r}: choose gymnasium.vector.AutoresetMode.SAME_STEP, NEXT_STEP or "
                     "DISABLED (or the names 'SAME_STEP', 'NEXT_STEP', 'DISABLED')")


def name_of(mode: Any) -> str:
    """``"SAME_STEP"``, ``"NEXT_STEP"`` or ``"DISABLED"``."""
    return next(name for name, member in MODES.items() if member == mode)
