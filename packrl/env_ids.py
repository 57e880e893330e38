"""What an env id names, and a creator for it.

The forms, tried in this order:

- a packrl Numba env name (``gridworld``, ``cartpole``);
- ``module:EnvId``, gymnasium's own form: importing ``module`` registers ``EnvId``
  (``minigrid:MiniGrid-Empty-5x5-v0``); else ``module:function``, a callable that returns an env, with the
  current folder on ``sys.path`` (``my_envs:make``);
- a PettingZoo module path (``pettingzoo.classic.connect_four_v3``, also ``mpe2.*`` and ``magent2.*``);
- a registered gymnasium id, importing the package of a known third-party namespace first
  (``MiniGrid-*`` and ``BabyAI-*``: minigrid), or saying which package to install.

An id that is none of these gets the closest known ids ("did you mean").

Worker processes resolve ids as the driver did: ``GymnasiumCreator`` imports the namespace module before
``gymnasium.make`` (as ``qualified_id``'s ``module:EnvId`` does), and the Ray backend's actors import the known
namespace modules the driver has imported (``loaded_namespaces``), so a creator such as
``lambda: gymnasium.make("MiniGrid-Empty-5x5-v0")`` also works in an actor that never ran ``import minigrid``.
"""
from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import sys
from typing import Any, Callable

from packrl import envs as packrl_envs
from packrl.errors import ConfigError

# id prefix -> (module that registers the ids, pip package)
NAMESPACES: dict[str, tuple[str, str]] = {
    "MiniGrid-": ("minigrid", "minigrid"),
    "BabyAI-": ("minigrid", "minigrid"),
    "ALE/": ("ale_py", "ale-py"),
    "MiniHack-": ("minihack", "minihack"),
    "NetHack": ("nle", "nle"),
}
PETTINGZOO_PACKAGES = ("pettingzoo", "mpe2", "magent2")
SUGGEST_FROM = ("minigrid",)  # imported (when installed) to suggest its ids: cheap, and the namespace most mistyped
ID_FORMS = ("a packrl env, a registered gymnasium id, module:EnvId, a pettingzoo.* module path "
            "or module:function")



def gymnasium_module() -> Any:
    """gymnasium, imported on first use (its 0.2 s): ``packrl --help``, ``inspect``, ``plot`` and a bad flag never
    pay it, and an env id is looked up only when a command needs one."""
    import gymnasium

    return gymnasium

class GymnasiumCreator:
    """``gymnasium.make(env_id, **kwargs)``, importing ``module`` first (the one that registers the id), so
    that a worker process that starts fresh finds the id too. Picklable."""

    def __init__(self, env_id: str, kwargs: dict, module: str | None = None):
        self.env_id, self.kwargs, self.module = env_id, kwargs, module

    def __call__(self) -> Any:
        gymnasium = gymnasium_module()
        from packrl.library_noise import quiet_known_prints  # imports gymnasium: as deferred as it

        if self.module:
            importlib.import_module(self.module)
        return quiet_known_prints(self.env_id, gymnasium.make(self.env_id, **self.kwargs))

    def __repr__(self) -> str:
        return f"GymnasiumCreator({self.env_id!r}, {self.kwargs!r}, module={self.module!r})"


def namespace_module(env_id: str) -> str | None:
    """The module that registers ``env_id`` when it is in a namespace packrl knows (``MiniGrid-*`` -> ``minigrid``)."""
    return next((module for prefix, (module, _) in NAMESPACES.items() if env_id.startswith(prefix)), None)


def qualified_id(env_id: str) -> str:
    """``env_id`` in gymnasium's ``module:EnvId`` form where packrl knows the module (``MiniGrid-Empty-5x5-v0`` ->
    ``minigrid:MiniGrid-Empty-5x5-v0``), so ``gymnasium.make`` imports it first in any process; else unchanged."""
    module = None if ":" in env_id else namespace_module(env_id)
    return f"{module}:{env_id}" if module else env_id


def loaded_namespaces() -> tuple[str, ...]:
    """The namespace modules packrl knows (NAMESPACES) that this process has imported. A worker process (a Ray
    actor, a spawned process) imports them too before building its envs, so its gymnasium registry holds the ids
    the driver's holds, whatever form the env creator names them in."""
    return tuple(sorted({module for module, _ in NAMESPACES.values() if module in sys.modules}))


def namespaces_named_in(text: str) -> tuple[str, ...]:
    """The known namespace modules whose id prefix occurs in ``text`` (gymnasium's NameNotFound message names the
    id): what a worker imports before it tries an env creator a second time."""
    return tuple(sorted({module for prefix, (module, _) in NAMESPACES.items() if prefix in text}))


def import_namespaces(modules: tuple[str, ...] | list[str]) -> None:
    """Import namespace modules by name; only those of packrl's fixed NAMESPACES table are ever imported (a name
    that travelled between processes never chooses other code). One that is not installed is skipped: the env
    creator's own error then says what is missing."""
    known = {module for module, _ in NAMESPACES.values()}
    for module in modules:
        if module not in known:
            raise ConfigError(f"namespace module {module!r} is not one packrl knows ({', '.join(sorted(known))})")
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def env_creator(env_id: str, kwargs: dict | None = None, api: str = "auto", *,
                allow_code: bool = True) -> tuple[Callable[[], Any], str]:
    """``(creator, default backend)`` for ``env_id`` (see the module docstring for the forms).

    ``allow_code=False`` is for ids read from files (checkpoints): an id that would make packrl import a
    module the id itself names (``module:function``, ``module:EnvId``) is refused with ConfigError. The
    fixed packages packrl knows (minigrid for ``MiniGrid-*``; ``pettingzoo.*`` module paths) stay allowed."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise ConfigError(f"env id must be a non-empty string, got {env_id!r}")
    kwargs = dict(kwargs or {})
    if env_id in packrl_envs.names():
        if kwargs:
            raise ConfigError(f"packrl env {env_id!r} takes no env.kwargs (got {sorted(kwargs)})")
        return (lambda: env_id), "numba"
    if ":" in env_id:
        return _module_attribute(env_id, kwargs, allow_code)
    if env_id.split(".")[0] in PETTINGZOO_PACKAGES and "." in env_id:
        return _pettingzoo(env_id, kwargs, api)
    return _gymnasium(env_id, kwargs)


def _module_attribute(env_id: str, kwargs: dict, allow_code: bool) -> tuple[Callable[[], Any], str]:
    """``module:EnvId`` when importing ``module`` registers ``EnvId`` with gymnasium, else ``module:function``."""
    gymnasium = gymnasium_module()

    module_name, _, attribute = env_id.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"env id {env_id!r}: write module:EnvId or module:function")
    known = module_name in {module for module, _ in NAMESPACES.values()}
    if not allow_code and not known:
        raise ConfigError(f"env id {env_id!r} names code to import and call; an id read from a file is never "
                          "executed: give the env on the command line (--env) or pass --trust-checkpoint")
    module = _import(module_name, env_id, search_cwd=allow_code)
    if attribute in gymnasium.registry:
        return GymnasiumCreator(attribute, kwargs, module_name), "serial"
    if not allow_code:
        raise ConfigError(f"env id {env_id!r}: importing {module_name} registers no gymnasium id {attribute!r}"
                          f"{_did_you_mean(attribute, _registered_ids())}")
    function = getattr(module, attribute, None)
    if function is None:
        registered = [i for i, spec in gymnasium.registry.items() if str(spec.entry_point).startswith(module_name)]
        candidates = registered + [n for n in dir(module) if not n.startswith("_")]
        raise ConfigError(f"env id {env_id!r}: module {module_name} has no attribute {attribute!r} and registers "
                          f"no gymnasium id {attribute!r}{_did_you_mean(attribute, candidates)}")
    if not callable(function):
        raise ConfigError(f"env id {env_id!r}: {module_name}.{attribute} is a {type(function).__name__}, not a "
                          "function that returns an env, and not a registered gymnasium id")
    return (lambda: function(**kwargs)), "serial"


def _pettingzoo(env_id: str, kwargs: dict, api: str) -> tuple[Callable[[], Any], str]:
    if not all(part.isidentifier() for part in env_id.split(".")):
        raise ConfigError(f"env id {env_id!r} is not a module path (dotted names, like pettingzoo.classic.chess_v6)")
    module = _import(env_id, env_id, search_cwd=False)
    has_parallel, has_aec = hasattr(module, "parallel_env"), hasattr(module, "env")
    if not (has_parallel or has_aec):
        raise ConfigError(f"env id {env_id!r}: the module has neither env() nor parallel_env(), so it is not a "
                          f"PettingZoo env module{_did_you_mean(env_id, _sibling_modules(env_id))}")
    if api == "parallel" and not has_parallel or api == "aec" and not has_aec:
        raise ConfigError(f"env id {env_id!r} has no {'parallel_env' if api == 'parallel' else 'env'}() for "
                          f"env.api = {api!r}")
    use_parallel = api == "parallel" or (api == "auto" and has_parallel)
    factory = module.parallel_env if use_parallel else module.env
    return (lambda: factory(**kwargs)), "serial"


def _gymnasium(env_id: str, kwargs: dict) -> tuple[Callable[[], Any], str]:
    gymnasium = gymnasium_module()

    module = namespace_module(env_id)
    if module is not None and env_id not in gymnasium.registry:
        pip = next(p for m, p in NAMESPACES.values() if m == module)
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"env {env_id!r} is registered by the {pip!r} package, which is not installed "
                              f"({err}): pip install {pip}" + (" (or packrl[envs])" if pip == "minigrid" else "")
                              ) from None
    if env_id not in gymnasium.registry:
        # the registry as it is first (an id close to CartPole-v1 is refused without importing minigrid's 0.3 s)
        close = _did_you_mean(env_id, _registered_ids(namespaces=False)) or _did_you_mean(env_id, _registered_ids())
        raise ConfigError(f"unknown env {env_id!r}{close}: not {ID_FORMS}")
    return GymnasiumCreator(env_id, kwargs, module), "serial"


def _import(module_name: str, env_id: str, search_cwd: bool) -> Any:
    """Import ``module_name`` for ``env_id``; every failure is one ConfigError line that says what to do."""
    if search_cwd and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `packrl train my_envs:make` finds ./my_envs.py like `python -m` would
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.split(".")[0] == err.name.split(".")[0] and module_name.startswith(err.name):
            pip = next((p for m, p in NAMESPACES.values() if m == err.name.split(".")[0]), None)
            if err.name == "pettingzoo":  # an extra since it stopped being a dependency
                hint = "PettingZoo is not installed: pip install 'packrl[pettingzoo]'"
            elif pip:
                hint = f"pip install {pip}"
            elif err.name.split(".")[0] in PETTINGZOO_PACKAGES and err.name != err.name.split(".")[0]:
                hint = f"no such module{_did_you_mean(module_name, _sibling_modules(module_name))}"
            else:
                hint = ("no such module on sys.path" + (f" (the current folder {os.getcwd()} included)"
                                                          if search_cwd else ""))
            raise ConfigError(f"env id {env_id!r}: cannot import {module_name!r}: {hint}") from None
        raise ConfigError(f"env id {env_id!r}: importing {module_name!r} failed: {err}") from None
    except Exception as err:  # noqa: BLE001 - the module's own code failed: one line, its type and message
        raise ConfigError(f"env id {env_id!r}: importing {module_name!r} raised {type(err).__name__}: {err}") from None


def _sibling_modules(module_name: str) -> list[str]:
    """The other modules of ``module_name``'s package (for "did you mean"), or nothing when it does not import."""
    parent = module_name.rpartition(".")[0]
    try:
        package = importlib.import_module(parent)
    except Exception:  # noqa: BLE001 - a user's module may raise any class
        return []
    return [f"{parent}.{m.name}" for m in pkgutil.iter_modules(getattr(package, "__path__", []))]


def _registered_ids(namespaces: bool = True) -> list[str]:
    """Gymnasium's registered ids, those of the known namespaces that are installed (``namespaces``), and packrl's
    envs."""
    gymnasium = gymnasium_module()

    for module in SUGGEST_FROM if namespaces else ():
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    return list(gymnasium.registry) + packrl_envs.names()


def _did_you_mean(word: str, candidates: list[str]) -> str:
    lower = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(word.lower(), list(lower), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(lower[c] for c in close)}?)" if close else ""
