"""Infos in gymnasium's vector form: one dict of arrays with a ``_key`` mask per key.

packrl's backends collect one dict per env (``infos="list"``, the default: most steps carry
no info, and a list of empty dicts costs nothing to build). ``vector.make(..., infos="dict")``
turns that list into what ``gymnasium.vector.SyncVectorEnv`` returns in its same-step autoreset
mode, so gymnasium's vector wrappers (``RecordEpisodeStatistics``, ``NormalizeReward``, ...)
work unchanged: on the step an env's episode ends, ``final_obs`` (an object array holding its
final row) and ``final_info`` (the info of that last step) are set for it, and its reset info
sits at the top level, as gymnasium does.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from packrl.errors import EnvError, UsageError

FORMS = ("list", "dict")
RESET_INFO = "reset_info"  # where a list-form info keeps the reset info of a same-step autoreset


def to_dict(infos: list[dict], ended: np.ndarray | None = None, final_rows: np.ndarray | None = None) -> dict:
    """gymnasium's dict of arrays from one info dict per env of a batch.

    ``ended`` (one bool per env) and ``final_rows`` (one row per env): the envs whose episode ended
    at this step get ``final_obs``/``final_info`` and their reset info at the top level; without
    them each info is added as it is (a reset, or envs of several agents whose ends are per row)."""
    n = len(infos)
    out: dict = {}
    ends = ended is not None and ended.any()
    if ends:  # every ended env has final_obs and final_info (empty or not), as in gymnasium: set in one go
        final_obs = np.full(n, None, dtype=object)
        where = np.flatnonzero(ended)
        copies = final_rows[where]  # one copy of the ended rows; each entry a row of it
        for k, i in enumerate(where.tolist()):
            final_obs[i] = copies[k]
        out["final_obs"], out["_final_obs"] = final_obs, ended.copy()
        out["final_info"], out["_final_info"] = {}, ended.copy()
    for i, info in enumerate(infos):  # env by env, as gymnasium: the first env to give a key types its array
        if not info:
            continue
        if ends and ended[i]:
            info = dict(info)
            reset_info = info.pop(RESET_INFO, {})
            if info:
                add_info(out["final_info"], info, i, n)
            info = reset_info
        if info:
            add_info(out, info, i, n)
    return out


def add_info(vector_infos: dict, info: dict, i: int, n: int) -> dict:
    """Add env ``i``'s ``info`` to ``vector_infos`` (``n`` envs) by gymnasium's own rule
    (``VectorEnv._add_info``): numbers into typed arrays, arrays stacked, nested dicts recursively,
    anything else in an object array; a ``_key`` bool mask marks the envs that gave ``key``."""
    for key, value in info.items():
        if key == "final_obs":
            array = vector_infos["final_obs"] if "final_obs" in vector_infos else np.full(n, None, dtype=object)
            array[i] = value
        elif isinstance(value, dict):
            if not isinstance(vector_infos.get(key, {}), dict):
                raise _mismatch(key, value, i, vector_infos[key])
            array = add_info(vector_infos.get(key, {}), value, i, n)
        else:
            if key in vector_infos:
                array = vector_infos[key]
                if isinstance(array, dict):
                    raise _mismatch(key, value, i, array)
            elif type(value) in (int, float, bool) or issubclass(type(value), np.number):
                array = np.zeros(n, dtype=type(value))
            elif isinstance(value, np.ndarray):
                array = np.zeros((n, *value.shape), dtype=value.dtype)
            else:
                array = np.full(n, None, dtype=object)
            if _narrows(value, array):
                raise _mismatch(key, value, i, array)
            try:
                array[i] = value
            except (TypeError, ValueError) as err:
                raise _mismatch(key, value, i, array) from err
        mask = vector_infos.get(f"_{key}", np.zeros(n, dtype=np.bool_))
        mask[i] = True
        vector_infos[key], vector_infos[f"_{key}"] = array, mask
    return vector_infos


_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _narrows(value: Any, array: np.ndarray) -> bool:
    """Would storing ``value`` in ``array`` lose it silently (a float in an int array, an int in a bool one)?
    gymnasium stores it truncated; packrl refuses."""
    have = _KIND_RANK.get(array.dtype.kind)
    if have is None:
        return False
    got = _KIND_RANK.get(np.asarray(value).dtype.kind)
    return got is not None and got > have


def _mismatch(key: Any, value: Any, i: int, existing: Any) -> Exception:
    """An env's info value that cannot join what earlier envs gave under the same key (gymnasium's rule
    types a key's array by the first env that gives it)."""
    made = "a dict" if isinstance(existing, dict) else f"a {existing.dtype} array of shape {existing.shape}"
    return EnvError(f"infos='dict': info key {key!r} of env {i} is {value!r} ({type(value).__name__}), which does not "
                    f"fit {made} made from an earlier env's value under that key; give every env the same kind of "
                    "value per key, or use infos='list'", env_index=i)


def check_form(infos: Any) -> str:
    """The ``infos=`` argument of ``vector.make``: ``"list"`` or ``"dict"``."""
    if infos not in FORMS:
        raise UsageError(f"infos={infos!r}: choose 'list' (one dict per env) or 'dict' (gymnasium's dict of "
                         "arrays with _key masks)")
    return infos
