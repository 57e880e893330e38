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

Refusals raise ``EmulationError`` (``RewardError``, ``FlagError``, ``ReturnShapeError``: ``packrl check``
files each under its own heading) naming the field, the value, the env (and the agent); a vector
backend reports them as ``EnvError`` with the env index, like any error an env raises.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from packrl.emulation.values import short
from packrl.errors import EmulationError


class RewardError(EmulationError):
    """A step's reward is not a real number, or not finite in float32."""


class FlagError(EmulationError):
    """A step's ``terminated`` or ``truncated`` is not a bool."""


class ReturnShapeError(EmulationError):
    """``reset()`` or ``step()`` returned values of the wrong number or kind (the pre-0.26 gym API, an info
    that is not a dict, a Parallel env's dict without a live agent)."""


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
    raise FlagError(f"{env_name(env)}{who}: step returned {field}={_value(value)}; it must be a bool "
                         f"(Python or NumPy){also}")


def checked_reward(value: Any, env: Any, finite: bool = True, who: str = "", hint: str = "") -> float:
    """``value`` as a Python float whose float32 value is finite (unless ``finite`` is False), or
    EmulationError naming the reward."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        also = f"; {hint}" if hint and isinstance(value, (list, tuple, dict, np.ndarray)) else ""
        raise RewardError(f"{env_name(env)}{who}: step returned reward={_value(value)}; it must be a real number "
                             f"(int, float or a NumPy integer or floating scalar){also}")
    try:
        number = float(value)
    except OverflowError:  # a Python int beyond float64
        number = float("inf") if value > 0 else float("-inf")
    if finite:
        with np.errstate(over="ignore"):
            narrow = np.float32(number)
        if not np.isfinite(narrow):
            raise RewardError(f"{env_name(env)}{who}: step returned reward={_value(value)}, which is not finite "
                                 "in float32; if the env returns non-finite rewards on purpose, emulate it with "
                                 "emulate(env, finite_rewards=False)")
    elif not -F32_MAX <= number <= F32_MAX and number == number:
        with np.errstate(over="ignore"):  # what float32 holds, without NumPy's overflow warning at the store
            number = float(np.float32(number))
    return number


# ---------------------------------------------------------------- the shapes of reset and step


WRAP_OLD_GYM = ("wrap the env with gymnasium's compatibility wrapper (pip install shimmy; "
                "shimmy.GymV21CompatibilityV0(env=env), or gymnasium.make('GymV21Environment-v0', env_id=...))")
OLD_GYM = f"this is the pre-0.26 gym API; {WRAP_OLD_GYM}"


def _returned(result: Any) -> str:
    if isinstance(result, tuple):
        return f"a tuple of {len(result)} values ({', '.join(type(v).__name__ for v in result[:6])})"
    return f"{short(result, 80)} ({type(result).__name__})"


def checked_reset(result: Any, env: Any, parallel: bool = False) -> tuple[Any, dict]:
    """``(observation, info)`` of what ``env.reset()`` returned, or EmulationError naming the env, the method
    and what it returned (an observation alone is the pre-0.26 gym API; a 2-key Dict observation is never
    taken apart as if it were the pair)."""
    if type(result) is not tuple or len(result) != 2:
        old = f"; an observation alone is the pre-0.26 gym API: {WRAP_OLD_GYM}" \
            if not isinstance(result, tuple) and not parallel else ""
        raise ReturnShapeError(f"{env_name(env)}: reset() returned {_returned(result)}; the API returns a tuple "
                             f"(observation{'s' if parallel else ''}, info{'s' if parallel else ''}){old}")
    obs, info = result
    if type(info) is not dict and not isinstance(info, dict):
        raise ReturnShapeError(f"{env_name(env)}: reset() returned info={_value(info)}; it must be a dict (if "
                               f"reset() returned only an observation that is a pair: {OLD_GYM})")
    return obs, info


def checked_step(result: Any, env: Any, parallel: bool = False) -> tuple:
    """The five values of what ``env.step()`` returned, or EmulationError (4 values: the pre-0.26 gym API)."""
    if type(result) is not tuple or len(result) != 5:
        n = len(result) if isinstance(result, tuple) else None
        old = f": {OLD_GYM}" if n == 4 else ""
        raise ReturnShapeError(f"{env_name(env)}: step() returned {_returned(result)}; the API returns 5 values "
                             f"(observation{'s' if parallel else ''}, reward{'s' if parallel else ''}, "
                             f"terminated, truncated, info{'s' if parallel else ''})" + old)
    return result


def checked_info(info: Any, env: Any, method: str = "step()", who: str = "") -> dict:
    """``info`` when it is a dict, else EmulationError naming the env and the method."""
    if isinstance(info, dict):
        return info
    raise ReturnShapeError(f"{env_name(env)}{who}: {method} returned info={_value(info)}; it must be a dict")


def checked_parallel_step(result: Any, env: Any, live: list) -> tuple:
    """A PettingZoo Parallel step's five dicts, rewards, terminations and truncations each holding a key for
    every agent in ``live`` (the agents that acted), each info present a dict; else EmulationError naming the
    env, the dict and the agent. Infos may leave agents out (the caller reads them as ``{}``)."""
    obs, rewards, terminations, truncations, infos = checked_step(result, env, parallel=True)
    wanted = set(live)  # compared with each dict's keys in C
    for name, value in (("observations", obs), ("rewards", rewards), ("terminations", terminations),
                        ("truncations", truncations), ("infos", infos)):
        if not isinstance(value, dict):
            raise ReturnShapeError(f"{env_name(env)}: step() returned {name}={_value(value)}; it must be a dict "
                                 "keyed by agent")
        if name not in ("observations", "infos") and not value.keys() >= wanted:  # a missing info loses nothing
            missing = [agent for agent in live if agent not in value]
            if missing:
                raise ReturnShapeError(f"{env_name(env)}: step() returned {name} without agent {missing[0]!r}, which "
                                     f"was alive and acted; every live agent needs a key in {name}"
                                     + (f" (+{len(missing) - 1} more missing)" if len(missing) > 1 else ""))
    for agent, info in infos.items():
        if not isinstance(info, dict):
            checked_info(info, env, "step()", who=f" (agent {agent!r})")
    return obs, rewards, terminations, truncations, infos


_UNPACK = re.compile(r"(not enough|too many) values to unpack \(expected (\d+)(?:, got (\d+))?\)")


def old_api_error(err: ValueError, env: Any, method: str) -> ReturnShapeError | None:
    """A ReturnShapeError for a ValueError that a gymnasium wrapper (TimeLimit, OrderEnforcing, ...) raised
    unpacking the return of the env inside it (``gymnasium.make`` wraps every env): the pre-0.26 gym API one
    layer down. None for any other ValueError, which is the env's own."""
    match = _UNPACK.fullmatch(str(err))
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    if match is None or not module.startswith("gymnasium."):
        return None
    got = match.group(3)
    if method == "step" and got == "4":
        what = f"step() returned 4 values: {OLD_GYM}"
    elif method == "reset" and match.group(1) in ("too many", "not enough"):
        what = f"reset() did not return (observation, info); an observation alone is the pre-0.26 gym API: {WRAP_OLD_GYM}"
    else:
        what = f"{method}() returned {got or 'more than ' + match.group(2)} values where {match.group(2)} are expected"
    return ReturnShapeError(f"{env_name(env)}: {what} (found by gymnasium's {module} unpacking it)")
