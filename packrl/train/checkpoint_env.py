"""What a checkpoint's config may ask for when its policy is rebuilt: checked as data, bounded, never run.

``checked_config`` type- and range-checks the recorded env and policy sections (a ``hidden`` of 10^12 is
refused before anything is allocated); ``is_data_env_id`` tells a name (resolved by looking it up) from
an id that names code or a file (``module:function``, ``../x``), which a checkpoint may not choose.
"""
from __future__ import annotations

import re
from pathlib import Path

import gymnasium

from packrl.checkpoint import CheckpointError
from packrl.config import MAX_HIDDEN, check_policy, defaults, settings
from packrl.env_ids import NAMESPACES
from packrl.errors import ConfigError

__all__ = ["MAX_HIDDEN", "checked_config", "checked_distributed", "is_data_env_id"]  # MAX_HIDDEN: the largest policy.hidden (packrl.config)


def checked_config(metadata: dict, file: Path) -> dict:
    """The recorded config's env and policy sections, each value checked by its setting (``packrl.config``:
    the one validator of config files, presets, flags and checkpoints; CheckpointError naming the field
    otherwise), defaults filled where training would have filled them."""
    def bad(field: str, why: str) -> CheckpointError:
        return CheckpointError(f"{file}: field 'config.{field}' {why}")

    config = metadata["config"]
    for section in ("env", "policy"):
        if not isinstance(config.get(section), dict):
            raise bad(section, "is missing or not an object")
    if "id" not in config["env"]:
        raise bad("env.id", "is missing")
    known, checked = settings(), defaults()
    for section in ("env", "policy"):
        for key, value in config[section].items():
            setting = known.get(f"{section}.{key}")
            if setting is None:
                raise bad(f"{section}.{key}", "is not a setting packrl knows")
            try:
                checked[section][key] = setting.check(value)
            except ConfigError as err:
                raise bad(setting.key, f"is {_short(value)}; expected {str(err).partition(': expected ')[2]}") from None
    env, policy = checked["env"], checked["policy"]
    if not env["id"]:
        raise bad("env.id", "is empty, not an env id")
    if metadata.get("env_id") not in (None, env["id"]):
        raise CheckpointError(f"{file}: field 'env_id' {metadata['env_id']!r} differs from config.env.id {env['id']!r}")
    try:
        check_policy(policy)
    except ConfigError as err:
        raise bad("policy.critic", f"does not fit: {err}") from None
    return {**config, "env": env, "policy": policy}


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


MAX_WORLD_SIZE = 1 << 16
"""The most ranks a checkpoint may say its run had."""


def checked_distributed(metadata: dict, file: Path) -> tuple[int, list]:
    """``(world_size, resume_by_rank)`` of a checkpoint: its ``distributed`` field, written by a data-parallel run
    (``packrl.train.session.Checkpoints``), or ``(1, [None])`` without one. ``resume_by_rank[r]`` is rank r's
    training state (None for rank 0, whose state is ``resume``). CheckpointError names a malformed field."""
    field = metadata.get("distributed")
    if field is None:
        return 1, [None]
    if not isinstance(field, dict):
        raise CheckpointError(f"{file}: field 'distributed' is not an object")
    world = field.get("world_size")
    if type(world) is not int or not 1 <= world <= MAX_WORLD_SIZE:
        raise CheckpointError(f"{file}: field 'distributed.world_size' is {world!r}; expected an integer from 1 to "
                              f"{MAX_WORLD_SIZE}")
    states = field.get("resume_by_rank")
    if not isinstance(states, list) or len(states) != world or \
            not all(isinstance(s, dict) for s in states[1:]):
        raise CheckpointError(f"{file}: field 'distributed.resume_by_rank' must list one training state per rank "
                              f"({world}; null for rank 0)")
    return world, states


DATA_ENV_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_][A-Za-z0-9_.\-]*)?")


def is_data_env_id(env_id: str) -> bool:
    """True for an id that is only a name (a registered gymnasium id, ``Namespace/Name-v0``, a packrl env, a
    ``pettingzoo.*`` module path, ``minigrid:EnvId`` for the packages packrl knows): no ``module:function``,
    no ``..``, no file path, and not one of gymnasium's compatibility shims, whose kwargs name an env to import."""
    module, colon, name = env_id.rpartition(":")
    if colon and module not in _known_modules():  # module:EnvId only for the fixed packages packrl knows
        return False
    if not DATA_ENV_ID.fullmatch(name) or ".." in name or name in SHIM_IDS:
        return False
    spec = gymnasium.registry.get(name)
    entry = spec.entry_point if spec is not None else None
    return not (isinstance(entry, str) and entry.split(".")[0] in SHIMS)  # a registered id that is a shim


SHIMS = ("shimmy",)
SHIM_IDS = ("GymV21Environment-v0", "GymV26Environment-v0")  # registered by gymnasium itself, for shimmy


def _known_modules() -> set[str]:
    """The modules ``module:EnvId`` may name in a checkpoint: those packrl itself imports for an id's namespace."""
    return {module for module, _ in NAMESPACES.values()}
