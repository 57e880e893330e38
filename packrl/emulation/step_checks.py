"""What an env's step returns, checked before it is stored: rewards and end flags.

One checker for every emulation (gymnasium, its block step, the Tuple-agents adapter, PettingZoo
Parallel and AEC). The callers test the common case inline (``type(r) is float`` and in float32
range, ``type(f) is bool``) and call these functions only for everything else, so the checks
cost nothing on the usual step.

- A flag (``terminated``, ``truncated``) is a Python or NumPy bool (a 0-d bool array too). A
  list, dict, string or int is refused: per-agent flags stored by truthiness would end every
  agent's episode at once.
- A reward is a real number: a Python int or float, a NumPy integer or floating scalar, or a 0-d
  array of one. A bool is refused (it is a flag handed over in the reward's place far more often
  than a reward), and so are None, strings, sequences and arrays of more than one number. Its
  float32 value must be finite unless the env is declared to return non-finite rewards
  (``emulate(env, finite_rewards=False)``): 1e300 would become inf in the float32 rewards.

Refusals raise ``EmulationError`` naming the field, the value, the env (and the agent); a vector
backend reports them as ``EnvError`` with the env index, like any error an env raises.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from packrl.emulation.values import short
from packrl.errors import EmulationError

F32_MAX = float(np.finfo(np.float32).max)
"""A Python float reward ``r`` with ``-F32_MAX <= r <= F32_MAX`` is finite in float32 (the fast path)."""

MULTI_AGENT_HINT = ("if the env holds several agents (a Tuple observation and action space with one entry per "
                    "agent), emulate it with emulate(env, agents='tuple')")


def env_name(env: Any) -> str:
    """How an error names an env: its registered id where it has one, else its class."""
    spec = getattr(env, "spec", None)
    env_id = getattr(spec, "id", None)
    cls = type(getattr(env, "unwrapped", env))
    return f"env {env_id!r} ({cls.__module__}.{cls.__qualname__})" if env_id else \
        f"env {cls.__module__}.{cls.__qualname__}"


def _value(value: Any) -> str:
    return f"{short(value, 80)} ({type(value).__name__})"


def checked_flag(value: Any, field: str, env: Any, who: str = "", hint: str = "") -> bool:
    """``value`` as a Python bool, or EmulationError naming ``field`` (``terminated``/``truncated``)."""
    if type(value) is bool:
        return value
    if isinstance(value, np.bool_) or (isinstance(value, np.ndarray) and value.shape == () and value.dtype == bool):
        return bool(value)
    also = f"; {hint}" if hint and isinstance(value, (list, tuple, dict, np.ndarray)) else ""
    raise EmulationError(f"{env_name(env)}{who}: step returned {field}={_value(value)}; it must be a bool "
                         f"(Python or NumPy){also}")


def checked_reward(value: Any, env: Any, finite: bool = True, who: str = "", hint: str = "") -> float:
    """``value`` as a Python float whose float32 value is finite (unless ``finite`` is False), or
    EmulationError naming the reward."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        also = f"; {hint}" if hint and isinstance(value, (list, tuple, dict, np.ndarray)) else ""
        raise EmulationError(f"{env_name(env)}{who}: step returned reward={_value(value)}; it must be a real number "
                             f"(int, float or a NumPy integer or floating scalar){also}")
    try:
        number = float(value)
    except OverflowError:  # a Python int beyond float64
        number = float("inf") if value > 0 else float("-inf")
    if finite:
        with np.errstate(over="ignore"):
            narrow = np.float32(number)
        if not np.isfinite(narrow):
            raise EmulationError(f"{env_name(env)}{who}: step returned reward={_value(value)}, which is not finite "
                                 "in float32; if the env returns non-finite rewards on purpose, emulate it with "
                                 "emulate(env, finite_rewards=False)")
    elif not -F32_MAX <= number <= F32_MAX and number == number:
        with np.errstate(over="ignore"):  # what float32 holds, without NumPy's overflow warning at the store
            number = float(np.float32(number))
    return number
