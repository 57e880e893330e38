"""The settings of a training run, typed: one dataclass per config section and one validation for every
source of a value.

A run's config has four sections, ``env``, ``vec``, ``policy`` and ``train``. Their fields are the dataclasses
below, and ``train`` is ``total_steps`` plus every field of ``packrl.hyperparameters.PPOConfig`` (read with
``dataclasses.fields``, so a new PPOConfig field is a setting, a flag and a TOML key at once). Each field is a
``Setting`` (type, default, range, help). Config files, presets and command-line flags all pass through
``Setting.check`` (typed values) or ``Setting.parse`` (flag text), which refuse what does not fit with a
``ConfigError`` of one line naming the key, the value, what is expected and where the value came from.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from packrl import presets
from packrl.errors import ConfigError
from packrl.hyperparameters import PPOConfig

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

SECTIONS = ("env", "vec", "policy", "train")
NETWORKS = ("mlp", "lstm", "gru", "mingru")
BACKENDS = ("auto", "serial", "multiprocessing", "numba", "ray")
LEAF_ENCODERS = ("flat", "embedding", "cnn", "nature", "impala", "cells", "words", "drop")  # encoders.CHOICES + "drop"
# (written out so that the command line starts without torch; tests/test_presets.py checks the two agree)


# ---------------------------------------------------------------- ranges


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``low``/``high`` (None: open), each inclusive unless said otherwise."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return f"<= {_num(self.high)}" if self.high is not None else ""


POSITIVE_INT = Range(1)
MAX_HIDDEN = 1 << 14
"""The widest ``policy.hidden``: what a checkpoint's loader accepts (a 16384-wide layer already holds 10^8
weights per matrix), so training never writes a checkpoint the loader refuses."""
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
UNIT = Range(0, 1)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _meta(help: str, range: Range | None = None, check: Callable[[Any], str | None] | None = None) -> dict:
    """Field metadata: the help line, the range of a number, and an extra check (returns why a value is bad)."""
    return {"help": help, "range": range, "check": check}


def _check_device(value: str) -> str | None:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, and only a device this torch build has."""
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
        return "auto, cpu, cuda, cuda:N or mps"
    import torch

    if value.startswith("cuda"):
        if not torch.cuda.is_available():
            return f"a device this machine has: torch {torch.__version__} sees no CUDA device (use cpu or auto)"
        index = int(value.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            return f"a CUDA device index below {torch.cuda.device_count()}"
    if value == "mps" and not torch.backends.mps.is_available():
        return f"a device this machine has: torch {torch.__version__} has no MPS device (use cpu or auto)"
    return None


def _check_overrides(value: dict) -> str | None:
    bad = {k: v for k, v in value.items() if v not in LEAF_ENCODERS}
    if bad:
        return f"a table of 'leaf/path' = one of {LEAF_ENCODERS} (bad: {bad})"
    return None


def _check_ray_address(value: str) -> str | None:
    """What ``ray.init(address=)`` takes: auto, local, host:port or ray://host:port (the ray backend checks the same)."""
    if value in ("auto", "local"):
        return None
    host, _, port = value.removeprefix("ray://").rpartition(":")
    if host and not any(c.isspace() or c in "/@" for c in host) and port.isdigit() and 1 <= int(port) <= 65535:
        return None
    return "auto, local, host:port or ray://host:port (port 1-65535)"


# ---------------------------------------------------------------- the sections


@dataclass
class EnvConfig:
    """``[env]``: which environment to train on."""

    id: str = field(default="gridworld", metadata=_meta(
        "gymnasium id, module:EnvId, MiniGrid-*/BabyAI-* id, pettingzoo.* module path, packrl env, module:function"))
    kwargs: dict = field(default_factory=dict, metadata=_meta("keyword arguments of the env constructor (a TOML table)"))
    api: Literal["auto", "aec", "parallel"] = field(default="auto", metadata=_meta(
        "PettingZoo API: parallel_env() or env() (auto: parallel when the module has it)"))


@dataclass
class VecConfig:
    """``[vec]``: how many copies of the env, stepped by which backend."""

    backend: Literal["auto", "serial", "multiprocessing", "numba", "ray"] = field(default="auto", metadata=_meta(
        "vector backend (auto: numba for packrl envs, serial otherwise)"))
    num_envs: int = field(default=8, metadata=_meta("copies of the env", POSITIVE_INT))
    num_workers: int | None = field(default=None, metadata=_meta(
        "worker processes or actors (multiprocessing and ray backends only; none: one per core)", POSITIVE_INT))
    address: str | None = field(default=None, metadata=_meta(
        "Ray cluster to join (ray backend only): auto, host:port or ray://host:port (none: RAY_ADDRESS, else a "
        "new local Ray)", check=_check_ray_address))
    step_timeout: float | None = field(default=300.0, metadata=_meta(
        "seconds one step (or reset) of the envs may take before the run stops with a line naming the env that "
        "hangs (serial, multiprocessing and ray backends; none: wait for ever)", POSITIVE))


@dataclass
class PolicyConfig:
    """``[policy]``: the Layout encoder, the network and the heads."""

    encoder: Literal["layout"] = field(default="layout", metadata=_meta(
        "observation encoder: the Layout encoder (each leaf by its kind; per-leaf choices in policy.overrides)"))
    network: Literal["mlp", "lstm", "gru", "mingru"] = field(default="mlp", metadata=_meta("core network"))
    hidden: int = field(default=128, metadata=_meta("hidden width of the encoder and network", Range(1, MAX_HIDDEN)))
    critic: Literal["shared", "separate"] = field(default="shared", metadata=_meta(
        "the value head's trunk: shared with the actor, or separate (its own encoder and mlp; mlp network only)"))
    decoder: Literal["default"] = field(default="default", metadata=_meta(
        "action heads from the action layout (masked when the env has an action mask)"))
    normalize_observations: bool = field(default=False, metadata=_meta(
        "normalize the flat observation features by running mean and variance (kept with the weights)"))
    squash_actions: bool = field(default=True, metadata=_meta(
        "Box actions: a Gaussian squashed into the space's bounds (true), or unbounded and clipped at the env (false, "
        "CleanRL's ppo_continuous_action)"))
    activation: Literal["relu", "tanh"] = field(default="relu", metadata=_meta(
        "nonlinearity of the encoder's projection and the mlp layers (tanh: CleanRL's and SB3's continuous-control "
        "networks)"))
    log_std_init: float = field(default=0.0, metadata=_meta(
        "initial log standard deviation of Box action heads (state-independent, learned)", Range(-5.0, 2.0)))
    overrides: dict = field(default_factory=dict, metadata=_meta(
        "per-leaf encoders: a table of 'leaf/path' = flat, embedding, cnn, nature, impala, cells, words or drop",
        check=_check_overrides))


@dataclass
class RunConfig:
    """The ``[train]`` keys that are not PPOConfig fields."""

    total_steps: int = field(default=100_000, metadata=_meta("agent steps to train for", POSITIVE_INT))


# Help and ranges of PPOConfig's fields: their one source (PPOConfig, in packrl.hyperparameters, holds the types and
# defaults; tests/test_settings_one_source.py fails when a field has no entry here).
TRAIN_FIELDS: dict[str, tuple[str, Range | None]] = {
    "num_steps": ("rollout length per row, per iteration", POSITIVE_INT),
    "learning_rate": ("Adam learning rate", POSITIVE),
    "anneal_lr": ("anneal the learning rate linearly to 0 over the run", None),
    "gamma": ("discount factor", UNIT),
    "gae_lambda": ("GAE lambda", UNIT),
    "num_minibatches": ("minibatches per epoch", POSITIVE_INT),
    "update_epochs": ("passes over the rollout per iteration", POSITIVE_INT),
    "norm_adv": ("normalize advantages per minibatch", None),
    "clip_coef": ("PPO clip range of the probability ratio", NON_NEGATIVE),
    "clip_vloss": ("clip the value loss like the policy loss", None),
    "ent_coef": ("entropy bonus coefficient", NON_NEGATIVE),
    "vf_coef": ("value loss coefficient", NON_NEGATIVE),
    "max_grad_norm": ("gradient clipping norm", POSITIVE),
    "target_kl": ("stop the epochs of an iteration when the approximate KL passes this (none: never)", POSITIVE),
    "vtrace": ("V-trace importance clipping of the advantages with the current policy, each epoch", None),
    "rho_clip": ("V-trace rho clip", POSITIVE),
    "c_clip": ("V-trace c clip", POSITIVE),
    "bootstrap_truncation": ("bootstrap V(final observation) on truncation (false: treat it as termination)", None),
    "bptt_horizon": ("recurrent segment length (none: num_steps)", POSITIVE_INT),
    "normalize_rewards": ("divide rewards by the running std of the discounted return, clipped to +-10", None),
    "bf16": ("bfloat16 autocast for the forward passes", None),
    "cuda_graphs": ("on CUDA, replay each rollout step as a captured CUDA graph (opt-in until shown on a GPU)", None),
    "compile": ("torch.compile the minibatch loss (and, off CPU, the rollout forward)", None),
    "overlap": ("step one half of the Numba envs while the policy runs for the other (same transitions; pays for "
                "large env batches, benchmarks/overlap.py)", None),
    "seed": ("seed of torch, the envs and the minibatch order", Range(0, 2**63 - 2**32)),
    "device": ("training device: auto (cuda when present), cpu, cuda, cuda:N, mps", None),
}
EXTRA_CHECKS: dict[str, Callable[[Any], str | None]] = {"device": _check_device}


@dataclass(frozen=True)
class SearchRange:
    """A tunable setting's default search range for ``packrl sweep`` (docs/sweep.md): ``low`` to ``high`` on a
    ``scale`` (linear; log; log1m: log-uniform in ``1 - value``, for discounts), or one of ``choices``."""

    low: float | None = None
    high: float | None = None
    scale: Literal["linear", "log", "log1m"] = "linear"
    choices: tuple = ()


SEARCH: dict[str, SearchRange] = {
    # rl-baselines3-zoo's PPO sampler (rl_zoo3/hyperparams_opt.py), narrowed where its range only loses time
    "train.learning_rate": SearchRange(1e-5, 1e-2, "log"),
    "train.gamma": SearchRange(0.9, 0.9999, "log1m"),
    "train.gae_lambda": SearchRange(0.8, 1.0),
    "train.num_steps": SearchRange(choices=(16, 32, 64, 128, 256, 512)),
    "train.num_minibatches": SearchRange(choices=(1, 2, 4, 8)),
    "train.update_epochs": SearchRange(1, 20),
    "train.clip_coef": SearchRange(0.1, 0.4),
    "train.ent_coef": SearchRange(1e-8, 0.1, "log"),
    "train.vf_coef": SearchRange(0.2, 1.0),
    "train.max_grad_norm": SearchRange(0.3, 5.0, "log"),
}
"""The settings ``packrl sweep`` searches by default, each with its range and scale."""


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    """One config key: ``section.name``, its type, default, range and help."""

    section: str
    name: str
    type: Any
    default: Any
    help: str
    range: Range | None = None
    extra_check: Callable[[Any], str | None] | None = None
    search: SearchRange | None = None  # the default range of ``packrl sweep`` (SEARCH); None: not searched

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> str:
        return f"--{self.key}"

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.type)

    @property
    def base(self) -> Any:
        """The type without ``| None``."""
        args = [a for a in typing.get_args(self.type) if a is not type(None)]
        return args[0] if self.optional and len(args) == 1 else self.type

    @property
    def choices(self) -> tuple | None:
        return typing.get_args(self.base) if typing.get_origin(self.base) is Literal else None

    def expected(self) -> str:
        """What a value must be, in words: ``a float in [0, 1]``, ``one of mlp, lstm``, ``an int >= 1 or none``."""
        base = self.base
        if self.choices:
            text = "one of " + ", ".join(map(str, self.choices))
        elif base is bool:
            text = "true or false"
        elif base is int:
            text = "an int"
        elif base is float:
            text = "a float"
        elif typing.get_origin(base) is dict or base is dict:
            text = "a table ({key = value, ...})"
        elif base is str:
            text = "a string"
        else:
            text = f"a {getattr(base, '__name__', base)}"
        if self.range is not None:
            text += f" {self.range}"
        return text + (" or none" if self.optional else "")

    def parse(self, text: str, flag: str | None = None) -> Any:
        """A value written on the command line as ``flag`` (default: ``--section.key``), checked like a typed one."""
        flag = flag or self.flag
        value = _from_text(self, text)
        if value is _BAD:
            raise ConfigError(f"{flag} {_show(text)}: expected {self.expected()} ({self.key})")
        return self.check(value, text=text, flag=flag)

    def check(self, value: Any, source: str | None = None, text: str | None = None, flag: str | None = None) -> Any:
        """``value`` as this setting's type, or ConfigError naming the key, the value, what fits and the source
        (a file or preset; for a flag, ``text`` as typed)."""

        def bad(why: str | None = None) -> ConfigError:
            if text is not None:  # a flag
                return ConfigError(f"{flag or self.flag} {_show(text)}: expected {why or self.expected()} ({self.key})")
            prefix = f"{source}: " if source else ""
            return ConfigError(f"{prefix}{self.key} = {value!r}: expected {why or self.expected()}")

        if value is None:
            if self.optional:
                return None
            raise bad()
        base = self.base
        if self.choices:
            if not isinstance(value, str) or value not in self.choices:
                raise bad()
        elif base is bool:
            if not isinstance(value, bool):
                raise bad()
        elif base is int:
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                value = int(value)  # 1e6 is exactly 1000000; 4.5 is refused
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad()
        elif base is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad()
            value = float(value)
        elif base is str:
            if not isinstance(value, str):
                raise bad()
        elif base is dict or typing.get_origin(base) is dict:
            if not isinstance(value, dict):
                raise bad()
            value = dict(value)
        if self.range is not None and not self.range.holds(value):
            raise bad()
        if self.extra_check is not None:
            why = self.extra_check(value)
            if why:
                raise bad(why)
        return value


_BAD = object()


def _show(text: str) -> str:
    """A flag's value as typed, quoted when it would not read as one word on one line."""
    return text if text and text.isprintable() and " " not in text else repr(text)


def _from_text(setting: Setting, text: str) -> Any:
    """The typed value of ``text`` for ``setting`` (``_BAD`` when it is not one): ``none`` for optional
    settings, true/false for bools, numbers as Python reads them, TOML inline tables for tables."""
    if setting.optional and text.strip().lower() in ("none", "null"):
        return None
    base = setting.base
    if base is bool:
        return {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
                "on": True, "off": False}.get(text.strip().lower(), _BAD)
    if base is int:
        try:
            return int(text.replace("_", ""))
        except ValueError:
            try:
                return float(text)  # 1e6 -> checked as an exact int by Setting.check
            except ValueError:
                return _BAD
    if base is float:
        try:
            return float(text.replace("_", ""))
        except ValueError:
            return _BAD
    if base is dict or typing.get_origin(base) is dict:
        parsed = parse_toml_value(text)
        return parsed if isinstance(parsed, dict) else _BAD
    return text


def parse_toml_value(text: str) -> Any:
    """``text`` as a TOML value (numbers, booleans, arrays, inline tables) when it is one, else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, KeyError):
        return text


def _dataclass_settings(section: str, cls: type, overrides: dict[str, tuple[str, Range | None]] | None = None,
                        ) -> list[Setting]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        help_text, value_range = (overrides or {}).get(f.name, (None, None))
        help_text = help_text or f.metadata.get("help") or f"{cls.__name__}.{f.name}"  # tests/test_settings_one_source
        value_range = value_range or f.metadata.get("range")
        check = f.metadata.get("check") or (EXTRA_CHECKS.get(f.name) if section == "train" else None)
        out.append(Setting(section, f.name, hints[f.name], default, help_text, value_range, check,
                           SEARCH.get(f"{section}.{f.name}")))
    return out


@functools.lru_cache(maxsize=1)
def settings() -> dict[str, Setting]:
    """Every setting by key (``"train.gamma"``), in section order."""
    out: list[Setting] = []
    out += _dataclass_settings("env", EnvConfig)
    out += _dataclass_settings("vec", VecConfig)
    out += _dataclass_settings("policy", PolicyConfig)
    out += _dataclass_settings("train", RunConfig)
    out += _dataclass_settings("train", PPOConfig, TRAIN_FIELDS)
    return {s.key: s for s in out}


def defaults() -> dict[str, dict]:
    """The config before any preset, file or flag: every env, vec and policy field, and ``train.total_steps``
    (the other train keys fall back to PPOConfig's own defaults)."""
    out: dict[str, dict] = {section: {} for section in SECTIONS}
    for s in settings().values():
        if s.section != "train" or s.name == "total_steps":
            out[s.section][s.name] = s.default
    return out


# ---------------------------------------------------------------- layers


class ConfigLayer(dict):
    """A dict of ``{section: {key: value}}`` that remembers where it came from (a file, a preset, flags),
    so that a bad value's error names its source."""

    def __init__(self, values: dict, source: str | None = None):
        super().__init__(values)
        self.source = source


def check_layer(layer: dict, source: str | None = None) -> dict[str, dict]:
    """``layer`` with every value checked and typed; unknown sections and keys are refused (with a close
    match when there is one)."""
    source = source if source is not None else getattr(layer, "source", None)
    prefix = f"{source}: " if source else ""
    known = settings()
    out: dict[str, dict] = {}
    for section, values in layer.items():
        if section not in SECTIONS:
            raise ConfigError(f"{prefix}unknown config section [{section}]{_did_you_mean(section, SECTIONS)}; "
                              f"sections are {', '.join(SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{prefix}[{section}] must be a table of settings, got {values!r}")
        for key, value in values.items():
            setting = known.get(f"{section}.{key}")
            if setting is None:
                names = [k.partition(".")[2] for k in known if k.startswith(section + ".")]
                raise ConfigError(f"{prefix}unknown key {section}.{key}{_did_you_mean(key, names, section + '.')}; "
                                  f"[{section}] keys: {', '.join(names)}")
            out.setdefault(section, {})[key] = setting.check(value, source)
    return out


def _did_you_mean(word: str, candidates: Any, prefix: str = "") -> str:
    close = difflib.get_close_matches(word, list(candidates), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(prefix + c for c in close)}?)" if close else ""


def merge(*layers: dict) -> dict[str, dict]:
    """``defaults()`` updated by each checked layer in turn."""
    config = copy.deepcopy(defaults())
    for layer in layers:
        for section, values in check_layer(layer).items():
            config[section].update(values)
    check_combination(config)
    return config


def check_combination(config: dict) -> None:
    """Checks across keys that each value alone cannot make."""
    train, policy = config["train"], config["policy"]
    horizon, num_steps = train.get("bptt_horizon"), train.get("num_steps", _ppo_default("num_steps"))
    if policy.get("network", "mlp") != "mlp" and horizon and num_steps % horizon:
        raise ConfigError(f"train.bptt_horizon = {horizon} must divide train.num_steps = {num_steps} "
                          f"(the {policy['network']} network trains on segments of bptt_horizon steps)")
    check_policy(policy)


def check_policy(policy: Mapping[str, Any], where: str = "") -> None:
    """The check across ``[policy]`` keys: a separate critic belongs to the MLP. ``where``: a prefix naming
    the file."""
    if policy.get("critic", "shared") == "separate" and policy.get("network", "mlp") != "mlp":
        raise ConfigError(f"{where}policy.critic = 'separate' needs policy.network = 'mlp', not "
                          f"{policy['network']!r} (a recurrent core's state belongs to one trunk)")


def policy_config(values: PolicyConfig | Mapping[str, Any], source: str | None = None) -> PolicyConfig:
    """The typed ``[policy]`` section: each key of ``values`` checked by its setting (unknown keys refused),
    the others ``PolicyConfig``'s defaults. A PolicyConfig is returned as it is."""
    if isinstance(values, PolicyConfig):
        return values
    checked = check_layer({"policy": dict(values)}, source).get("policy", {})
    check_policy(checked, f"{source}: " if source else "")
    return PolicyConfig(**checked)


def _ppo_default(name: str) -> Any:
    return settings()[f"train.{name}"].default


def resolve(file_layer: dict | None = None, flags: dict | None = None, preset: str = "auto") -> tuple[dict, Any]:
    """The config of a run and the preset it used: ``defaults < preset < file < flags``. The preset is
    ``preset`` by name, ``none``, or (``auto``) the one of the env id's family (``packrl.presets``)."""
    layers = [layer for layer in (file_layer, flags) if layer]
    env_id = defaults()["env"]["id"]
    for layer in layers:
        env_id = check_layer(layer).get("env", {}).get("id", env_id)
    chosen = presets.choose(preset, env_id)
    preset_settings = chosen.settings if chosen else {}
    if _overrides_network(layers) and "critic" in preset_settings.get("policy", {}) \
            and not any("critic" in (layer.get("policy") or {}) for layer in layers):
        # the preset's separate critic belongs to its MLP: a network chosen over the preset's brings its own trunk
        preset_settings = {**preset_settings, "policy": {k: v for k, v in preset_settings["policy"].items() if k != "critic"}}
    preset_layer = ConfigLayer(preset_settings, f"preset {chosen.name}") if chosen else {}
    return merge(preset_layer, *layers), chosen


def _overrides_network(layers: list[dict]) -> bool:
    """Whether a config file or a flag chooses a network other than the MLP."""
    return any((layer.get("policy") or {}).get("network", "mlp") != "mlp" for layer in layers)
