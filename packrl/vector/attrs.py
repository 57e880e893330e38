"""``call``, ``get_attr``, ``set_attr`` and ``render`` over every env of a vector env, as
gymnasium's vector envs have them.

They reach the env the creator returned (inside packrl's emulation wrapper), through gymnasium's
``get_wrapper_attr``/``set_wrapper_attr`` where the env has them. Each backend runs a ``Request``
over its blocks of envs (``run_block``: in this process, in a worker process or in a Ray actor)
and returns one result per env, in env order. A call never steps an env, so an env that raises
in one leaves the vector env usable: the error names the env index.
"""
from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any

from packrl.errors import EnvError, UsageError

# Calls that would step, reset or re-point an env behind the vector env's back (its rows and flags).
REFUSED = ("reset", "step", "close", "set_buffers")
WRAPPERS = "__wrappers__"  # not an attribute: the classes of an env's wrapper chain (for SB3's env_is_wrapped)


@dataclass(frozen=True)
class Request:
    """Get (``values`` None) or call ``name`` with ``args``/``kwargs``, or set it (``values``: one
    value per env of the block it goes to)."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    call: bool = True
    values: tuple | None = None
    only: frozenset | None = None  # global indices of the envs it goes to (None: every env); the others give None

    def block(self, first: int, count: int) -> "Request":
        """The request for envs ``first .. first + count - 1`` (their share of ``values``)."""
        if self.values is None:
            return self
        return Request(self.name, self.args, self.kwargs, self.call, self.values[first: first + count], self.only)


@dataclass(frozen=True)
class CallFailed:
    """Env ``env_index`` raised ``kind`` (a builtin exception's name) with ``text`` (its traceback)."""

    env_index: int
    kind: str
    message: str
    text: str


def target(env: Any) -> Any:
    """The env the creator returned: emulated envs keep it as ``.env``."""
    return env.env if hasattr(env, "emulated") and hasattr(env, "env") else env


def run_block(envs: list, first: int, request: Request) -> list:
    """Run ``request`` on each env of a block (global indices from ``first``); one result per env,
    or a one-item list holding the ``CallFailed`` of the first env that raised."""
    results = []
    for k, env in enumerate(envs):
        if request.only is not None and first + k not in request.only:
            results.append(None)
            continue
        try:
            results.append(_run_one(target(env), request, k))
        except Exception as err:  # noqa: BLE001 - reported with the env index, the vector env stays usable
            return [CallFailed(first + k, type(err).__name__, str(err), traceback.format_exc())]
    return results


def run_block_pickled(envs: list, first: int, request: Request) -> bytes:
    """``run_block`` pickled for a worker's pipe; a result that cannot pickle is a ``CallFailed``."""
    results = run_block(envs, first, request)
    try:
        return pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # noqa: BLE001
        for k, value in enumerate(results):  # noqa: B007 - k is the env that failed after the break
            try:
                pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001
                break
        failed = CallFailed(first + k, type(err).__name__, f"its result of {request.name!r} cannot be sent to the "
                            f"main process (it must pickle): {err}", traceback.format_exc())
        return pickle.dumps([failed], protocol=pickle.HIGHEST_PROTOCOL)


def _run_one(env: Any, request: Request, k: int) -> Any:
    if request.name == WRAPPERS:
        return wrapper_types(env)
    if request.values is not None:
        if hasattr(env, "set_wrapper_attr"):
            env.set_wrapper_attr(request.name, request.values[k])
        else:
            setattr(env, request.name, request.values[k])
        return None
    value = env.get_wrapper_attr(request.name) if hasattr(env, "get_wrapper_attr") else getattr(env, request.name)
    return value(*request.args, **request.kwargs) if request.call and callable(value) else value


def wrapper_types(env: Any) -> tuple:
    """The classes of ``env`` and of every gymnasium wrapper under it, outermost first."""
    types = [type(env)]
    while hasattr(env, "env") and env is not getattr(env, "unwrapped", env):
        env = env.env
        types.append(type(env))
    return tuple(types)


def checked(results: list) -> tuple:
    """The results as a tuple; the first ``CallFailed`` raised, naming its env."""
    for value in results:
        if isinstance(value, CallFailed):
            if value.kind == "AttributeError":
                raise AttributeError(f"env {value.env_index}: {value.message}")
            raise EnvError(f"env {value.env_index} raised {value.kind} in a call: {value.message}\n{value.text}",
                           env_index=value.env_index, env_traceback=value.text)
    return tuple(results)


class EnvAttributes:
    """gymnasium's ``call``/``get_attr``/``set_attr``/``render`` for a vector env whose backend
    implements ``call_envs(request) -> list`` (one result per env, in env order)."""

    num_envs: int

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple:
        """Call method ``name`` of every env with ``args``/``kwargs`` (an attribute that is not
        callable is returned as it is, like gymnasium); one result per env."""
        if name in REFUSED:
            raise UsageError(f"call({name!r}) would reach the envs behind the vector env's back (its arrays and "
                             "episode flags); use the vector env's own reset/step/close")
        return checked(self.call_envs(Request(_name(name), args, kwargs)))

    def get_attr(self, name: str) -> tuple:
        """Attribute ``name`` of every env (as gymnasium's ``get_attr``, a method is called)."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` of every env: ``values`` a list or tuple with one value per env,
        or one value for all of them."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise UsageError(f"set_attr({name!r}, values): {len(values)} values for {self.num_envs} envs; pass "
                             "one value per env, or a single value (not a list or tuple) for all of them")
        checked(self.call_envs(Request(_name(name), call=False, values=tuple(values))))

    def render(self) -> tuple:
        """Every env's ``render()`` (their ``render_mode`` is set where they are made)."""
        return checked(self.call_envs(Request("render")))

    def call_envs(self, request: Request) -> list:
        """The backend's one route into its envs (the compat layers use it too): ``request`` run on every env, one
        result or ``EnvFailure`` per env, in env order."""
        raise UsageError(f"{type(self).__name__} cannot run calls on its envs")

    @staticmethod
    def _check_idle(in_flight: Any) -> None:
        """Calls reach the envs only between batches (a worker stepping its envs cannot also run a call)."""
        if in_flight:
            raise UsageError("call/get_attr/set_attr/render while envs are stepping: recv() their batch first "
                             "(with batch_size < num_envs, some envs are always stepping)")


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise UsageError(f"an attribute name must be a non-empty str, got {name!r}")
    return name

