"""One training run from a config: resolve the env, build the vector env and policy, train, save.

The config has four sections, as in a TOML file::

    [env]    id = "gridworld"          # gymnasium id, pettingzoo module path, packrl Numba env, module:function
             kwargs = {}               # passed to the env constructor
    [vec]    backend = "numba"         # serial, multiprocessing, numba (default: numba for packrl envs)
             num_envs = 64
    [policy] encoder = "layout"        # the Layout encoder (per-leaf choices under [policy.overrides])
             network = "mlp"           # mlp, lstm, gru, mingru
             hidden = 128
             decoder = "default"       # heads from the action layout (masked when the env has an action mask)
    [train]  total_steps = 100000      # plus any PPOConfig field (learning_rate, num_steps, ...)
"""
from __future__ import annotations

import copy
import importlib
import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from packrl.checkpoint import load_checkpoint, save_checkpoint
from packrl.errors import PackrlError
from packrl.train.ppo import PPO, PPOConfig

DEFAULTS: dict[str, dict] = {
    "env": {"id": "gridworld", "kwargs": {}, "api": "auto"},
    "vec": {"backend": "auto", "num_envs": 8, "num_workers": None},
    "policy": {"encoder": "layout", "network": "mlp", "hidden": 128, "decoder": "default", "overrides": {}},
    "train": {"total_steps": 100_000},
}


class ConfigError(PackrlError, ValueError):
    """A config file or flag names a section, key or value that does not exist."""


def merge_config(*layers: dict) -> dict:
    """DEFAULTS updated by each layer in turn (file, then command-line flags); unknown keys are refused."""
    config = copy.deepcopy(DEFAULTS)
    known_train = set(PPOConfig.__dataclass_fields__) | {"total_steps"}
    for layer in layers:
        for section, values in layer.items():
            if section not in config:
                raise ConfigError(f"unknown config section [{section}]; sections are {sorted(config)}")
            for key, value in values.items():
                allowed = known_train if section == "train" else set(DEFAULTS[section])
                if key not in allowed:
                    raise ConfigError(f"unknown key {section}.{key}; known: {sorted(allowed)}")
                config[section][key] = value
    return config


def load_config_file(path: str | Path) -> dict:
    """A TOML (``.toml``) or INI (other suffixes) file as nested dicts; INI values are parsed as TOML values."""
    path = Path(path)
    text = path.read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    if path.suffix == ".toml":
        return tomllib.loads(text)
    import configparser

    parser = configparser.ConfigParser()
    parser.read_string(text)
    return {s: {k: parse_value(v) for k, v in parser[s].items()} for s in parser.sections()}


def parse_value(text: str) -> Any:
    """A command-line or INI value: a TOML literal when it is one (numbers, booleans, arrays, tables), else the string."""
    try:
        import tomllib
    except ImportError:
        import tomli as tomllib
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except Exception:
        return text


# ---------------------------------------------------------------- envs


def env_creator(env_id: str, kwargs: dict | None = None, api: str = "auto", *,
                allow_code: bool = True) -> tuple[Callable[[], Any], str]:
    """``(creator, default backend)`` for an env id: a packrl Numba env name, ``module:function``,
    a PettingZoo module path (``pettingzoo.classic.connect_four_v3``), or a gymnasium id.

    ``allow_code=False`` is for ids read from files (checkpoints): an id that would make packrl import a
    module or call a function the id itself names (``module:function``) is refused with ConfigError."""
    kwargs = dict(kwargs or {})
    from packrl import envs as packrl_envs

    if env_id in packrl_envs.names():
        if kwargs:
            raise ConfigError(f"packrl env {env_id!r} takes no env.kwargs (got {sorted(kwargs)})")
        return (lambda: env_id), "numba"
    if ":" in env_id:
        if not allow_code:
            raise ConfigError(f"env id {env_id!r} names code to import and call; an id read from a file is never "
                              "executed: give the env on the command line (--env) or pass --trust-checkpoint")
        module_name, _, function = env_id.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"cannot load env creator {env_id!r}: {err}") from None
        return (lambda: fn(**kwargs)), "serial"
    if env_id.startswith("pettingzoo."):
        try:
            module = importlib.import_module(env_id)
        except ImportError as err:
            raise ConfigError(f"cannot import PettingZoo env {env_id!r}: {err}") from None
        use_parallel = api == "parallel" or (api == "auto" and hasattr(module, "parallel_env"))
        factory = module.parallel_env if use_parallel else module.env
        return (lambda: factory(**kwargs)), "serial"
    import gymnasium

    if env_id not in gymnasium.registry:
        raise ConfigError(f"unknown env {env_id!r}: not a packrl env ({packrl_envs.names()}), not module:function, "
                          "not a pettingzoo.* module, and not a registered gymnasium id")
    return (lambda: gymnasium.make(env_id, **kwargs)), "serial"


def make_vecenv(config: dict, seed: int = 0) -> Any:
    from packrl import vector

    creator, default_backend = env_creator(config["env"]["id"], config["env"].get("kwargs"), config["env"].get("api", "auto"))
    vec = config["vec"]
    backend = default_backend if vec.get("backend", "auto") == "auto" else vec["backend"]
    extra = {"num_workers": vec["num_workers"]} if backend == "multiprocessing" and vec.get("num_workers") else {}
    return vector.make(creator, int(vec["num_envs"]), backend=backend, seed=seed, **extra)


def make_policy(vecenv: Any, policy_config: dict) -> torch.nn.Module:
    from packrl.models import Policy

    if policy_config.get("encoder", "layout") != "layout" or policy_config.get("decoder", "default") != "default":
        raise ConfigError("policy.encoder must be 'layout' and policy.decoder 'default' (per-leaf encoders go under "
                          "[policy.overrides] as 'path/to/leaf' = 'flat' | 'embedding' | 'cnn' | 'nature' | 'impala' | 'drop')")
    overrides = {tuple(_path_key(k) for k in path.split("/")): choice
                 for path, choice in (policy_config.get("overrides") or {}).items()}
    return Policy.from_env(vecenv, network=policy_config["network"], hidden=int(policy_config["hidden"]),
                           overrides=overrides or None)


def _path_key(part: str) -> Any:
    return int(part) if part.isdigit() else part


def ppo_config(config: dict) -> PPOConfig:
    train = {k: v for k, v in config["train"].items() if k != "total_steps"}
    return PPOConfig(**train)


# ---------------------------------------------------------------- checkpoints


def save(ppo: PPO, config: dict, path: str | Path, history: list[dict]) -> Path:
    env = ppo.env
    layouts = {"observation": env.emulated.observation, "action": env.emulated.action.layout}
    returns = [h["episode_return"] for h in history if "episode_return" in h]
    return save_checkpoint(path, ppo.policy.state_dict(), config=config, layouts=layouts,
                           env_id=config["env"]["id"], seed=ppo.config.seed, optimizer=ppo.optimizer.state_dict(),
                           global_step=ppo.global_step, iteration=ppo.iteration,
                           last_episode_return=returns[-1] if returns else None)


def load_policy(path: str | Path, device: str = "cpu", *, env: str | None = None, env_kwargs: dict | None = None,
                trust_checkpoint: bool = False, expected_sha256: str | None = None, num_envs: int = 1,
                seed: int = 0, render_mode: str | None = None) -> tuple[torch.nn.Module, dict, Any]:
    """Rebuild a checkpoint's policy on an env and load its weights: ``(policy, metadata, vecenv)``.

    A checkpoint is data: nothing it records chooses code to import or call. The env is ``env`` (an id the
    caller gives, with ``env_kwargs``, or the recorded kwargs when it is the recorded id and that id is not
    code), else the recorded id resolved as data (a packrl env, a registered gymnasium id, a ``pettingzoo.*``
    module path; ``module:function`` refused). ``trust_checkpoint=True`` lets the recorded id and kwargs run as
    they would in training: only for checkpoints whose author you trust. The recorded layouts must equal the
    env's; the architecture is bounded and every tensor's shape checked before a weight is allocated.
    ``render_mode`` is added to the env's kwargs. Every refusal is a CheckpointError naming the file and the field."""
    from packrl import vector
    from packrl.checkpoint import (METADATA, CheckpointError, checkpoint_folder, compare_layout, tensor_specs,
                                   verify)
    from packrl.train.checkpoint_env import checked_config, is_data_env_id

    metadata = verify(path, expected_sha256)
    file = checkpoint_folder(path) / METADATA
    config = checked_config(metadata, file)
    recorded_id, recorded_kwargs, api = config["env"]["id"], config["env"]["kwargs"], config["env"]["api"]
    extra = {} if render_mode is None else {"render_mode": render_mode}
    try:
        if trust_checkpoint:
            creator, default_backend = env_creator(recorded_id, {**recorded_kwargs, **extra}, api, allow_code=True)
        elif env is not None:
            if env_kwargs is None:
                env_kwargs = recorded_kwargs if env == recorded_id and is_data_env_id(recorded_id) else {}
            creator, default_backend = env_creator(env, {**env_kwargs, **extra}, api, allow_code=True)
        else:
            if not is_data_env_id(recorded_id):
                raise ConfigError(f"env id {recorded_id!r} is not a registered env id (it names code or a path); "
                                  "give the env with --env ID, or pass --trust-checkpoint to run what it names")
            creator, default_backend = env_creator(recorded_id, {**recorded_kwargs, **extra}, api, allow_code=False)
    except ConfigError as err:
        if env is not None and not trust_checkpoint:
            raise
        raise CheckpointError(f"{file}: field 'config.env.id': {err}") from None
    backend = "numba" if default_backend == "numba" else "serial"
    try:
        vecenv = vector.make(creator, int(num_envs), backend=backend, seed=seed)
    except Exception as err:
        if env is not None or trust_checkpoint:
            raise
        raise CheckpointError(f"{file}: field 'config.env.kwargs': the recorded env {recorded_id!r} could not be "
                              f"built with them ({type(err).__name__}: {err})") from None
    try:
        emulated = vecenv.emulated
        compare_layout(metadata["layouts"].get("observation"), emulated.observation.to_dict(), "observation", file)
        compare_layout(metadata["layouts"].get("action"), emulated.action.layout.to_dict(), "action", file)
        policy = make_policy(vecenv, config["policy"])
        state, metadata, _ = load_checkpoint(path, device, expected_sha256=expected_sha256,
                                             expected=tensor_specs(policy.state_dict()))
        policy.load_state_dict(state)
    except BaseException:
        vecenv.close()
        raise
    return policy.to(device), metadata, vecenv


# ---------------------------------------------------------------- plots


def plot_learning_curve(history: list[dict], path: str | Path, title: str) -> Path | None:
    """Mean episode return per iteration against agent steps, as a PNG (None when no episode ended)."""
    points = [(h["global_step"], h["episode_return"]) for h in history if "episode_return" in h]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, returns = np.array(points).T
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(steps, returns, lw=1, alpha=0.4, label="per iteration")
    window = max(1, len(returns) // 20)
    if window > 1:
        smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, lw=2, label=f"mean of {window}")
    ax.set(xlabel="agent steps", ylabel="episode return", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def write_history(history: list[dict], path: str | Path) -> None:
    Path(path).write_text("\n".join(json.dumps({k: v for k, v in h.items() if _finite(v)}) for h in history) + "\n")


def _finite(v: Any) -> bool:
    return not isinstance(v, float) or math.isfinite(v)
