"""The search space of a sweep: the settings' own default ranges (``packrl.config.SEARCH``), narrowed, widened,
fixed or extended by a TOML space file (its format: docs/sweep.md).

A space file mirrors a config file: ``[section]`` tables whose keys are settings. A table value
(``{low, high, scale}`` or ``{choices}``) is a range to search, a plain value fixes the setting, and the
top-level keys ``defaults`` (false: search only the settings the file names) and ``skip`` (settings left out of
the default search) choose which defaults stay. Every mistake is one ``SpaceError`` line naming the file and key.
"""
from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packrl import config as config_settings
from packrl.errors import ConfigError

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

SCALES = ("linear", "log", "log1m")
RANGE_KEYS = ("low", "high", "scale", "choices")
TOP_LEVEL = ("defaults", "skip")


class SpaceError(ConfigError):
    """A space file that cannot be searched (an unknown setting or scale, low > high, an empty categorical)."""


@dataclass(frozen=True)
class Dimension:
    """One searched setting: ``low`` to ``high`` on ``scale``, or one of ``choices``; ``integer`` for int settings."""

    key: str
    low: float | None = None
    high: float | None = None
    scale: str = "linear"
    choices: tuple = ()
    integer: bool = False

    @property
    def param(self) -> str:
        """The Optuna parameter name: the key, or ``1-key`` for a log1m range (Optuna searches 1 - value)."""
        return f"1-{self.key}" if self.scale == "log1m" and not self.choices else self.key

    def suggest(self, trial: Any) -> Any:
        """The trial's parameter value for this dimension (Optuna's public suggest calls)."""
        if self.choices:
            return trial.suggest_categorical(self.param, list(self.choices))
        if self.scale == "log1m":
            return trial.suggest_float(self.param, 1.0 - self.high, 1.0 - self.low, log=True)
        if self.integer:
            return trial.suggest_int(self.param, int(self.low), int(self.high), log=self.scale == "log")
        return trial.suggest_float(self.param, float(self.low), float(self.high), log=self.scale == "log")

    def value(self, param_value: Any) -> Any:
        """The setting's value of an Optuna parameter value."""
        if self.scale == "log1m" and not self.choices:
            return 1.0 - float(param_value)
        return param_value

    def describe(self) -> dict:
        if self.choices:
            return {"key": self.key, "choices": list(self.choices)}
        return {"key": self.key, "low": self.low, "high": self.high, "scale": self.scale, "integer": self.integer}


@dataclass(frozen=True)
class Space:
    """The dimensions searched and the settings fixed (``{section: {key: value}}``)."""

    dimensions: tuple[Dimension, ...]
    fixed: dict = field(default_factory=dict)

    def describe(self) -> dict:
        """The space as plain data: a study records it, and refuses to continue under another."""
        return {"dimensions": [d.describe() for d in self.dimensions], "fixed": self.fixed}

    def identity(self) -> str:
        return json.dumps(self.describe(), sort_keys=True)

    def suggest(self, trial: Any) -> dict:
        """The settings of an Optuna trial (``{section: {key: value}}``), sampling each dimension."""
        out: dict[str, dict] = {}
        for d in self.dimensions:
            value = d.value(d.suggest(trial))
            section, _, name = d.key.partition(".")
            out.setdefault(section, {})[name] = value
        return out

    def settings_of(self, params: dict) -> dict:
        """The settings (``{section: {key: value}}``) of a finished trial's parameters."""
        out: dict[str, dict] = {}
        for d in self.dimensions:
            if d.param in params:
                section, _, name = d.key.partition(".")
                out.setdefault(section, {})[name] = d.value(params[d.param])
        return out


def default_space() -> Space:
    """Every setting with a default search range (``Setting.search``), each searched over it."""
    return Space(tuple(_dimension(s, s.search.low, s.search.high, s.search.scale, s.search.choices, "packrl.config")
                       for s in config_settings.settings().values() if s.search is not None))


def load_space(path: str | Path | None) -> Space:
    """The default space, changed by the space file at ``path`` (None: the defaults as they are)."""
    if path is None:
        return default_space()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpaceError(f"{path}: no such space file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpaceError(f"{path}: cannot read the space file: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise SpaceError(f"{path}: not valid TOML: {err}") from None
    return space_from(data, str(path))


def space_from(data: dict, source: str) -> Space:
    """The space of a parsed space file (``source`` names it in errors)."""
    known = config_settings.settings()
    use_defaults = data.get("defaults", True)
    if not isinstance(use_defaults, bool):
        raise SpaceError(f"{source}: defaults = {use_defaults!r}: expected true or false")
    skip = data.get("skip", [])
    if not isinstance(skip, list) or not all(isinstance(k, str) for k in skip):
        raise SpaceError(f"{source}: skip = {skip!r}: expected a list of settings (\"train.ent_coef\")")
    for key in skip:
        _setting(key, known, source)
    dims = {d.key: d for d in default_space().dimensions if use_defaults and d.key not in skip}
    fixed: dict[str, dict] = {}
    for section, values in data.items():
        if section in TOP_LEVEL:
            continue
        if section not in config_settings.SECTIONS or not isinstance(values, dict):
            raise SpaceError(f"{source}: unknown section or key {section!r}{_close(section, [*config_settings.SECTIONS, *TOP_LEVEL])}; "
                             f"a space file has [{'] ['.join(config_settings.SECTIONS)}] tables and {', '.join(TOP_LEVEL)}")
        for name, value in values.items():
            setting = _setting(f"{section}.{name}", known, source)
            searchable = setting.base is not dict and not isinstance(setting.default, dict)
            if isinstance(value, dict) and searchable:
                dims[setting.key] = _range(setting, value, dims.get(setting.key), source)
            else:
                dims.pop(setting.key, None)
                fixed.setdefault(section, {})[name] = setting.check(value, source)
    return Space(tuple(dims.values()), fixed)


def _setting(key: str, known: dict, source: str) -> Any:
    if key not in known:
        raise SpaceError(f"{source}: unknown setting {key}{_close(key, known)}")
    return known[key]


def _close(word: str, candidates: Any) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _range(setting: Any, table: dict, default: Dimension | None, source: str) -> Dimension:
    """A dimension from a space file's table; ``low``, ``high`` and ``scale`` left out keep the default range's."""
    unknown = [k for k in table if k not in RANGE_KEYS]
    if unknown:
        raise SpaceError(f"{source}: {setting.key}: unknown key {unknown[0]!r} (a range has {', '.join(RANGE_KEYS)})")
    if "choices" in table:
        if set(table) - {"choices"}:
            raise SpaceError(f"{source}: {setting.key}: give either choices or low/high/scale, not both")
        return _dimension(setting, None, None, "linear", table["choices"], source)
    base = default if default is not None and not default.choices else None
    if base is None and setting.search is not None and not setting.search.choices:
        base = Dimension(setting.key, setting.search.low, setting.search.high, setting.search.scale)
    low = table.get("low", base.low if base else None)
    high = table.get("high", base.high if base else None)
    scale = table.get("scale", base.scale if base else "linear")
    if low is None or high is None:
        raise SpaceError(f"{source}: {setting.key}: give low and high (it has no default range), or choices")
    return _dimension(setting, low, high, scale, (), source)


def _dimension(setting: Any, low: Any, high: Any, scale: Any, choices: Any, source: str) -> Dimension:
    """A checked dimension: each bound or choice a valid value of the setting, a known scale, low <= high, a log
    range above 0 (log1m: below 1), a non-empty categorical."""
    key = setting.key
    if choices or isinstance(choices, list):
        if not isinstance(choices, (list, tuple)) or not choices:
            raise SpaceError(f"{source}: {key}: choices = {list(choices) if isinstance(choices, tuple) else choices!r}: "
                             "an empty categorical (give at least one value)")
        values = tuple(setting.check(c, source) for c in choices)
        if len(set(map(repr, values))) != len(values):
            raise SpaceError(f"{source}: {key}: choices {list(values)} repeat a value")
        return Dimension(key, choices=values)
    if setting.base not in (int, float) or setting.choices:
        raise SpaceError(f"{source}: {key}: a {setting.expected()} setting is searched over choices = [...], not low/high")
    if scale not in SCALES:
        raise SpaceError(f"{source}: {key}: unknown scale {scale!r} (expected {', '.join(SCALES)})")
    low, high = setting.check(low, source), setting.check(high, source)
    if low > high:
        raise SpaceError(f"{source}: {key}: low {low} > high {high}")
    if scale == "log" and low <= 0:
        raise SpaceError(f"{source}: {key}: a log range needs low > 0, not {low}")
    if scale == "log1m":
        if setting.base is int:
            raise SpaceError(f"{source}: {key}: scale log1m (log of 1 - value) is for floats below 1, not an int setting")
        if high >= 1:
            raise SpaceError(f"{source}: {key}: a log1m range searches 1 - value on a log scale and needs high < 1, "
                             f"not {high}")
    if not all(math.isfinite(float(x)) for x in (low, high)):
        raise SpaceError(f"{source}: {key}: low and high must be finite")
    return Dimension(key, low, high, scale, (), setting.base is int)
