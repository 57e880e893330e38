"""One training run from a config: resolve the env, build the vector env and policy, train, save.

The config has four sections, as in a TOML file (every key, its type, range and default: ``packrl.config``,
or ``packrl train --help``)::

    [env]    id = "gridworld"          # gymnasium id, module:EnvId, pettingzoo module path, packrl Numba env, module:function
             kwargs = {}               # passed to the env constructor
    [vec]    backend = "numba"         # serial, multiprocessing, numba, ray (default: numba for packrl envs)
             num_envs = 64
    [policy] encoder = "layout"        # the Layout encoder (per-leaf choices under [policy.overrides])
             network = "mlp"           # mlp, lstm, gru, mingru
             hidden = 128
             decoder = "default"       # heads from the action layout (masked when the env has an action mask)
    [train]  total_steps = 100000      # plus any PPOConfig field (learning_rate, num_steps, ...)
"""
from __future__ import annotations

import configparser
import math
from pathlib import Path
from typing import Any, Mapping

import torch

from packrl import config as config_settings
from packrl import envs, vector
from packrl.checkpoint import (
    DTYPE_SIZES,
    CheckpointError,
    Verified,
    compare_layout,
    compare_specs,
    load_checkpoint,
    read_header,
    save_checkpoint,
    tensor_specs,
    verify,
)
from packrl.config import PolicyConfig
from packrl.env_ids import env_creator
from packrl.errors import ConfigError, EmulationError, PackrlError
from packrl.models import GroupedPolicy, Policy
from packrl.train.checkpoint_env import checked_config, checked_distributed, is_data_env_id
from packrl.train.plot import plot_learning_curve  # noqa: F401 - re-exported: it lived here before matplotlib became optional
from packrl.train.ppo import PPO, PPOConfig, seed_everything

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

DEFAULTS: dict[str, dict] = config_settings.defaults()  # the config dataclasses' defaults (packrl.config)


def merge_config(*layers: dict) -> dict:
    """DEFAULTS updated by each layer in turn (preset, file, then command-line flags). Every value is checked
    and typed by its setting (packrl.config); unknown sections and keys are refused with ConfigError, which
    names the file of a layer read by ``load_config_file``."""
    return config_settings.merge(*layers)


def load_config_file(path: str | Path) -> dict:
    """A TOML file (INI for ``.ini``/``.cfg``, its values read as TOML values) as ``{section: {key: value}}``,
    remembering its name for error messages. A missing file or bad syntax is one ConfigError line naming it."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the config file: {err}") from None
    if path.suffix.lower() in (".ini", ".cfg"):
        parser = configparser.ConfigParser()
        try:
            parser.read_string(text, source=str(path))
        except configparser.Error as err:
            raise ConfigError(f"{path}: not a valid INI file: {' '.join(str(err).split())}") from None
        values = {s: {k: parse_value(v) for k, v in parser[s].items()} for s in parser.sections()}
        return config_settings.ConfigLayer(values, str(path))
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    return config_settings.ConfigLayer(values, str(path))


def parse_value(text: str) -> Any:
    """A command-line or INI value: a TOML literal when it is one (numbers, booleans, arrays, tables), else the string."""
    return config_settings.parse_toml_value(text)


# ---------------------------------------------------------------- envs


def make_vecenv(config: dict, seed: int = 0) -> Any:
    """The vector env of ``config["env"]`` and ``config["vec"]``; a backend that cannot take the env or the
    worker count is refused (ConfigError) before any env is built."""
    env, vec = config["env"], config["vec"]
    creator, default_backend = env_creator(env["id"], env.get("kwargs"), env.get("api", "auto"))
    chosen = vec.get("backend", "auto")
    backend = default_backend if chosen == "auto" else chosen
    how = f"backend {backend!r}" + (" (auto for this env)" if chosen == "auto" else "")
    num_workers = vec.get("num_workers")
    if num_workers is not None and backend not in ("multiprocessing", "ray"):
        raise ConfigError(f"vec.num_workers = {num_workers} applies to the multiprocessing and ray backends, not "
                          f"{how}: set vec.backend (--backend multiprocessing) or leave num_workers out")
    if backend == "numba" and default_backend != "numba":
        raise ConfigError(f"vec.backend = 'numba' steps packrl's Numba envs ({', '.join(_packrl_env_names())}), "
                          f"not {env['id']!r}: use serial or multiprocessing")
    if default_backend == "numba" and backend not in ("numba", "multiprocessing"):
        raise ConfigError(f"packrl env {env['id']!r} runs on the numba backend (or numba inside multiprocessing "
                          f"workers), not {how}")
    extra = {"num_workers": num_workers} if num_workers is not None else {}
    if config.get("train", {}).get("overlap"):
        if backend != "numba":
            raise ConfigError(f"train.overlap steps packrl's Numba envs in two halves, not {how}: use a Numba env "
                              f"({', '.join(_packrl_env_names())}) or leave overlap off")
        if int(vec["num_envs"]) % 2:
            raise ConfigError(f"train.overlap splits the envs into two equal halves: vec.num_envs = {vec['num_envs']} "
                              "must be even")
        extra["halves"] = True
    if vec.get("address") is not None:
        if backend != "ray":
            raise ConfigError(f"vec.address = {vec['address']!r} is the Ray cluster of the ray backend, not {how}: "
                              "set vec.backend = 'ray' (--backend ray) or leave address out")
        extra["address"] = vec["address"]
    if vec.get("step_timeout") is not None and backend in ("serial", "multiprocessing", "ray"):
        extra["step_timeout"] = float(vec["step_timeout"])  # a hanging env stops the run naming it (numba: compiled)
    try:
        return vector.make(creator, int(vec["num_envs"]), backend=backend, seed=seed, **extra)
    except PackrlError as err:
        if getattr(err, "env_traceback", None) is None:
            raise
        raise ConfigError(f"env {env['id']!r} could not be made with env.kwargs {env.get('kwargs') or {}}: "
                          f"{_last_line(str(err))}") from None
    except Exception as err:  # noqa: BLE001 - the env's constructor raised: a bad id or env.kwargs, one line
        raise ConfigError(f"env {env['id']!r} could not be made with env.kwargs {env.get('kwargs') or {}}: "
                          f"{type(err).__name__}: {_last_line(str(err))}") from None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _packrl_env_names() -> list[str]:
    return envs.names()


def make_policy(vecenv: Any, policy: PolicyConfig | Mapping) -> torch.nn.Module:
    """The policy ``policy`` describes on ``vecenv``'s layouts. A mapping (a config's ``[policy]`` section) is
    checked and typed by its settings first (``packrl.config.policy_config``): every default is PolicyConfig's.
    An env whose agents fall into groups with different observation spaces gets a GroupedPolicy (one policy per
    group, the same settings); ConfigError where the groups' action spaces differ or the network is recurrent."""
    config = config_settings.policy_config(policy)
    if not vecenv.emulated.heterogeneous:
        return Policy.from_env(vecenv, config)
    if config.network != "mlp":
        raise ConfigError(f"policy.network = {config.network!r}: an env whose agents have different spaces trains "
                          "one policy per agent group, and those must be stateless (network = \"mlp\")")
    try:
        return GroupedPolicy.from_env(vecenv, config)
    except EmulationError as err:
        raise ConfigError(str(err)) from None


def ppo_config(config: dict) -> PPOConfig:
    """The PPOConfig of ``config["train"]`` (its keys but ``total_steps``; values checked by merge_config)."""
    train = {k: v for k, v in config["train"].items() if k != "total_steps"}
    return PPOConfig(**train)


def build_ppo(config: dict) -> PPO:
    """The vector env, policy and PPO ``config`` describes, seeded before the policy is built (the seed fixes
    the initial weights, then the env seeds and sampling). The caller closes ``ppo.env``."""
    cfg = ppo_config(config)
    seed_everything(cfg.seed)
    vecenv = make_vecenv(config, seed=cfg.seed)
    try:
        return PPO(vecenv, make_policy(vecenv, config["policy"]), cfg)
    except BaseException:
        vecenv.close()
        raise


# ---------------------------------------------------------------- checkpoints


def save(ppo: PPO, config: dict, path: str | Path, history: list[dict], extra: dict | None = None) -> Path:
    """A checkpoint of ``ppo`` at an iteration boundary: weights, optimizer, and under ``resume`` the counters
    and RNG states ``PPO.load_training_state`` continues from (``packrl train --resume``). ``extra``: more
    metadata fields (a data-parallel run's ``distributed``)."""
    env = ppo.env
    layouts = {"observation": env.emulated.observation, "action": env.emulated.action.layout,
               **{f"observation/{g}": group.observation for g, group in enumerate(env.emulated.groups) if g}}
    returns = [h["episode_return"] for h in history if isinstance(h.get("episode_return"), float)
               and math.isfinite(h["episode_return"])]
    return save_checkpoint(path, ppo.policy.state_dict(), config=config, layouts=layouts,
                           env_id=config["env"]["id"], seed=ppo.config.seed, optimizer=ppo.optimizer.state_dict(),
                           global_step=ppo.global_step, iteration=ppo.iteration,
                           last_episode_return=returns[-1] if returns else None, resume=ppo.training_state(),
                           **(extra or {}))


MAX_POLICY_BYTES = 2 << 30
"""The largest policy (parameters and buffers) a checkpoint may rebuild unless the caller raises the budget
(``packrl eval --max-policy-gib``)."""


def check_architecture(vecenv: Any, policy_config: PolicyConfig | Mapping, weights: Path | Verified,
                       max_bytes: int = MAX_POLICY_BYTES) -> None:
    """Before a checkpoint's policy is allocated: build it on the meta device (shapes only, no memory), then
    refuse (CheckpointError naming the file) a policy whose tensors differ from the weights' header, or
    that would take more than 4x the weights file or ``max_bytes``. ``weights``: the file, or a ``Verified``
    checkpoint (its header and size as verified: nothing is read again)."""
    if isinstance(weights, Verified):
        tensors, size, weights = weights.tensors, len(weights.data), weights.weights
    else:
        (tensors, _), size = read_header(weights), weights.stat().st_size
    try:
        with torch.device("meta"):
            shapes = make_policy(vecenv, policy_config)
    except (ConfigError, CheckpointError):
        raise
    except (RuntimeError, TypeError, ValueError, NotImplementedError):  # a part that needs data: the real build checks it
        return
    specs = tensor_specs(shapes.state_dict())
    compare_specs(tensors, specs, weights)
    needed = sum(math.prod(shape) * DTYPE_SIZES[dtype] for dtype, shape in specs.values())
    budget = min(4 * size, max_bytes)
    if needed > budget:
        raise CheckpointError(f"{weights}: the policy its config describes takes {needed:,} bytes, more than the "
                              f"budget of {budget:,} (4x the weights file, at most {max_bytes:,}); refusing to build it")


def check_fits(verified: Verified, vecenv: Any, policy_config: PolicyConfig | Mapping,
               max_bytes: int = MAX_POLICY_BYTES) -> tuple[int, list]:
    """What a checkpoint must share with the env and policy it is loaded into, checked alike by ``packrl eval``
    (``load_policy``) and ``packrl train --resume`` before a weight is allocated: the recorded observation and
    action layouts equal the env's, the architecture its config describes fits the weights' header within the
    memory budget (``check_architecture``), and its ``distributed`` field is well formed. Returns the recorded
    ``(world size, training state by rank)`` (``checked_distributed``). CheckpointError names the field."""
    check_layouts(verified, vecenv)
    check_architecture(vecenv, policy_config, verified, max_bytes)
    return checked_distributed(verified.metadata, verified.file)


def check_layouts(verified: Verified, vecenv: Any) -> None:
    """The recorded observation and action layouts equal the env's (CheckpointError naming the first leaf
    that differs, or a recorded layout that is not a layout); an env whose agents fall into groups has each further
    group's observation layout recorded as ``observation/G``, and the groups must match in number too."""
    layouts, file, emulated = verified.metadata["layouts"], verified.file, vecenv.emulated
    compare_layout(layouts.get("observation"), emulated.observation.to_dict(), "observation", file)
    compare_layout(layouts.get("action"), emulated.action.layout.to_dict(), "action", file)
    recorded = 1 + sum(1 for key in layouts if key.startswith("observation/"))
    if recorded != len(emulated.groups):
        raise CheckpointError(f"{file}: the checkpoint's policy is for {recorded} agent group(s), the env's agents "
                              f"fall into {len(emulated.groups)} (groups of agents with equal spaces)")
    for g, group in enumerate(emulated.groups[1:], start=1):
        compare_layout(layouts.get(f"observation/{g}"), group.observation.to_dict(), f"observation/{g}", file)


def load_policy(path: str | Path | Verified, device: str = "cpu", *, env: str | None = None,
                env_kwargs: dict | None = None, trust_checkpoint: bool = False, expected_sha256: str | None = None,
                num_envs: int = 1, seed: int = 0, render_mode: str | None = None,
                max_policy_bytes: int = MAX_POLICY_BYTES) -> tuple[torch.nn.Module, dict, Any]:
    """Rebuild a checkpoint's policy on an env and load its weights: ``(policy, metadata, vecenv)``.

    The checkpoint is verified once (``packrl.checkpoint.verify``; a ``Verified`` given is not hashed again),
    its env made (``checkpoint_vecenv``), what it must share with that env checked (``check_fits``), and the
    policy built and loaded from the verified bytes. Every refusal is a CheckpointError naming the file and the
    field."""
    verified = verify(path, expected_sha256)
    vecenv = checkpoint_vecenv(verified, env=env, env_kwargs=env_kwargs, trust_checkpoint=trust_checkpoint,
                               num_envs=num_envs, seed=seed, render_mode=render_mode)
    try:
        policy = checkpoint_policy(verified, vecenv, device, max_policy_bytes)
    except BaseException:
        vecenv.close()
        raise
    return policy, verified.metadata, vecenv


def checkpoint_policy(verified: Verified, vecenv: Any, device: str = "cpu",
                      max_policy_bytes: int = MAX_POLICY_BYTES) -> torch.nn.Module:
    """The verified checkpoint's policy on ``vecenv``: ``check_fits`` first, then built and loaded from the
    bytes that were hashed."""
    policy_config = checked_config(verified.metadata, verified.file)["policy"]
    check_fits(verified, vecenv, policy_config, max_policy_bytes)
    policy = make_policy(vecenv, policy_config)
    state, _, _ = load_checkpoint(verified, device, expected=tensor_specs(policy.state_dict()))
    policy.load_state_dict(state)
    return policy.to(device)


def checkpoint_vecenv(verified: Verified, *, env: str | None = None, env_kwargs: dict | None = None,
                      trust_checkpoint: bool = False, num_envs: int = 1, seed: int = 0,
                      render_mode: str | None = None) -> Any:
    """The env a verified checkpoint is evaluated on, its layouts checked against the recorded ones.

    A checkpoint is data: nothing it records chooses code to import or call. The env is ``env`` (an id the
    caller gives, with ``env_kwargs``, or the recorded kwargs when it is the recorded id and that id is not
    code), else the recorded id resolved as data (a packrl env, a registered gymnasium id, a ``pettingzoo.*``
    module path; ``module:function`` refused) with the recorded kwargs, ``env_kwargs`` over them.
    ``trust_checkpoint=True`` lets the recorded id and kwargs run as they would in training: only for checkpoints
    whose author you trust. ``render_mode`` is added to the env's kwargs."""
    metadata, file = verified.metadata, verified.file
    config = checked_config(metadata, file)
    recorded_id, recorded_kwargs, api = config["env"]["id"], config["env"]["kwargs"], config["env"]["api"]
    extra = {} if render_mode is None else {"render_mode": render_mode}
    try:
        if trust_checkpoint:
            creator, default_backend = env_creator(recorded_id, {**recorded_kwargs, **(env_kwargs or {}), **extra}, api,
                                                   allow_code=True)
        elif env is not None:
            if env_kwargs is None:
                env_kwargs = recorded_kwargs if env == recorded_id and is_data_env_id(recorded_id) else {}
            creator, default_backend = env_creator(env, {**env_kwargs, **extra}, api, allow_code=True)
        else:
            if not is_data_env_id(recorded_id):
                raise ConfigError(f"env id {recorded_id!r} is not a registered env id (it names code or a path); "
                                  "give the env with --env ID, or pass --trust-checkpoint to run what it names")
            # kwargs given without --env change the recorded env's (they were silently dropped)
            creator, default_backend = env_creator(recorded_id, {**recorded_kwargs, **(env_kwargs or {}), **extra}, api,
                                                   allow_code=False)
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
        check_layouts(verified, vecenv)
    except BaseException:
        vecenv.close()
        raise
    return vecenv
