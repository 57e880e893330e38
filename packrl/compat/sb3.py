"""A packrl vector env as a Stable-Baselines3 ``VecEnv``: ``as_sb3(vector.make(...))``.

Observations are what SB3 expects of the space it is shown:

- ``observations="rows"`` (the default for envs whose observation is a Box): the rows as they are,
  ``(num_envs, *shape)`` of the Box's dtype.
- ``observations="leaves"`` (the default for structured envs): a one-level ``spaces.Dict`` with one
  key per leaf of the Layout (its path, e.g. ``"image"`` or ``"agent/position"``), each the leaf's
  own space and exact dtype, unpacked from the rows (``Layout.unpack``; nothing promoted to float).
  SB3's ``MultiInputPolicy`` takes it as it takes any Dict observation (its ``DictRolloutBuffer``
  keeps each key's dtype; its feature extractor one-hots Discrete leaves and floats Boxes).

Each step returns copies (SB3 keeps the previous observation while the envs step on), sets
``infos[i]["TimeLimit.truncated"]`` (truncated and not terminated) and, where an episode ended,
``infos[i]["terminal_observation"]`` from ``final_observations`` in the same form; the reset info
of a same-step autoreset goes to ``reset_infos[i]``, as in SB3's own VecEnvs. ``seed()`` then
``reset()`` seeds env i with ``seed + i``, as SB3 and packrl both do.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices

from packrl.errors import UsageError
from packrl.vector.attrs import WRAPPERS, Request, checked
from packrl.vector.infos import RESET_INFO

OBSERVATIONS = ("rows", "leaves")


def as_sb3(venv: Any, observations: str | None = None, skip: tuple = ()) -> "PackrlVecEnv":
    """``venv`` (from ``packrl.vector.make``; one agent per env, every env stepped at once) as an SB3
    VecEnv. ``observations``: ``"rows"``, ``"leaves"`` or None (rows for a Box observation, leaves
    otherwise). ``skip``: leaf keys to leave out of the leaves (e.g. MiniGrid's Text ``"mission"``)."""
    return PackrlVecEnv(venv, observations, skip)


class PackrlVecEnv(VecEnv):
    """SB3's ``VecEnv`` interface over a packrl vector env (see the module docstring)."""

    def __init__(self, venv: Any, observations: str | None = None, skip: tuple = ()):
        _check_vector_env(venv)
        self.venv = venv
        self.layout = venv.emulated.observation
        box_rows = self.layout.box is not None
        if observations is None:
            observations = "rows" if box_rows else "leaves"
        if observations not in OBSERVATIONS:
            raise UsageError(f"observations={observations!r}: choose 'rows' or 'leaves'")
        if observations == "leaves" and box_rows:
            raise UsageError("observations='leaves': this env's observation is a Box, so its rows already are the "
                             "observation; use observations='rows'")
        self.observations = observations
        if skip and observations != "leaves":
            raise UsageError(f"skip={skip!r} applies to observations='leaves'")
        self._leaves = _sb3_leaves(self.layout, tuple(skip)) if observations == "leaves" else None
        space = (spaces.Dict({key: sub for key, (_, sub) in self._leaves.items()}) if self._leaves is not None
                 else venv.single_observation_space)
        self._actions: np.ndarray | None = None
        super().__init__(venv.num_envs, space, venv.single_action_space)

    # ------------------------------------------------------------ stepping

    def reset(self) -> Any:
        if any(self._options):
            raise UsageError("packrl vector envs take no reset options (set_options)")
        obs, infos = self.venv.reset(seed=self._seeds[0])
        self.reset_infos = [dict(info) for info in _per_env(infos, self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return self._observe(obs)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, list[dict]]:
        if self._actions is None:
            raise UsageError("step_wait() without step_async(actions)")
        obs, rewards, terminals, truncations, infos = self.venv.step(self._actions)
        self._actions = None
        dones = terminals | truncations
        out = []
        for i, info in enumerate(_per_env(infos, self.num_envs)):
            info = dict(info)
            info["TimeLimit.truncated"] = bool(truncations[i] and not terminals[i])
            if dones[i]:
                info["terminal_observation"] = self._observe_one(self.venv.final_observations[i])
                self.reset_infos[i] = info.pop(RESET_INFO, {})
            out.append(info)
        return self._observe(obs), rewards.copy(), dones.copy(), out

    def _observe(self, rows: np.ndarray) -> Any:
        """Copies of the rows (SB3 keeps them past the next step), as rows or as a dict of leaves."""
        rows = rows.copy()
        if self._leaves is None:
            return rows
        tree = self.layout.unpack(rows)
        return {key: _leaf(tree, leaf, len(rows)) for key, (leaf, _) in self._leaves.items()}

    def _observe_one(self, row: np.ndarray) -> Any:
        if self._leaves is None:
            return row.copy()
        return {key: value[0] for key, value in self._observe(row[None]).items()}

    def close(self) -> None:
        self.venv.close()

    # ------------------------------------------------------------ env attributes

    def get_images(self) -> list:
        if self.render_mode != "rgb_array":
            return [None] * self.num_envs
        return list(self.venv.render())

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        if attr_name == "render_mode" and not hasattr(self.venv, "_call_envs"):
            return [None] * self.num_envs  # Numba copies render nothing
        return self._on(Request(attr_name, call=False), indices)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        targets = self._get_indices(indices)
        self._on(Request(attr_name, call=False, values=tuple(value for _ in range(self.num_envs))), targets)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list:
        return self._on(Request(method_name, method_args, method_kwargs), indices)

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [any(issubclass(t, wrapper_class) for t in types) for types in self._on(Request(WRAPPERS), indices)]

    def _on(self, request: Request, indices: VecEnvIndices) -> list:
        """Run ``request`` on the envs of ``indices`` only; their results in that order."""
        if not hasattr(self.venv, "_call_envs"):
            raise UsageError(f"{request.name!r}: the copies of a Numba env are rows of one compiled state, not env objects")
        targets = list(self._get_indices(indices))
        if request.name in ("reset", "step", "close", "set_buffers"):
            raise UsageError(f"env_method({request.name!r}) would reach the envs behind the vector env's back")
        only = None if len(targets) == self.num_envs else frozenset(targets)
        results = checked(self.venv._call_envs(Request(request.name, request.args, request.kwargs, request.call,
                                                       request.values, only)))
        return [results[i] for i in targets]

    def _get_indices(self, indices: VecEnvIndices) -> Iterable[int]:
        if indices is None:
            return range(self.num_envs)
        if isinstance(indices, (int, np.integer)):
            return [int(indices)]
        return [int(i) for i in indices]


def _check_vector_env(venv: Any) -> None:
    what = f"{type(venv).__module__}.{type(venv).__name__}"
    for name in ("emulated", "final_observations", "num_envs", "step", "reset"):
        if not hasattr(venv, name):
            raise UsageError(f"as_sb3 takes a packrl vector env (packrl.vector.make(...)); {what} has no {name!r}")
    if getattr(venv, "agents_per_env", 1) != 1:
        raise UsageError(f"as_sb3: each env holds {venv.agents_per_env} agents; SB3's VecEnv has one agent per env")
    if getattr(venv, "batch_size", venv.num_envs) != venv.num_envs:
        raise UsageError(f"as_sb3: batch_size={venv.batch_size} < num_envs={venv.num_envs}; SB3 steps every env at once")
    if getattr(venv, "info_format", "list") != "list":
        raise UsageError("as_sb3 reads infos as one dict per env: make the vector env with infos='list' (the default)")
    action = venv.single_action_space
    if not isinstance(action, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Box)):
        raise UsageError(f"as_sb3: SB3 has no policy for the action space {action} (packrl's hybrid discrete + "
                         "continuous actions); use packrl.train.PPO")


def _per_env(infos: Any, n: int) -> list:
    """One info dict per env; the Numba backend's one dict of per-copy arrays carries none per env."""
    return [{} for _ in range(n)] if isinstance(infos, dict) else infos


SB3_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def _sb3_leaves(layout: Any, skip: tuple = ()) -> dict[str, tuple[Any, spaces.Space]]:
    """Leaf name -> (leaf, the space SB3 is shown). A 0-d Box leaf is shown with shape (1,) (SB3
    flattens from the second axis); leaves SB3 cannot take are refused by name unless skipped."""
    keys = {"/".join(str(part) for part in leaf.path) or "obs" for leaf in layout.leaves}
    unknown = sorted(set(skip) - keys)
    if unknown:
        raise UsageError(f"skip={list(skip)!r}: no observation leaf {unknown}; the leaves are {sorted(keys)}")
    out = {}
    for leaf in layout.leaves:
        space, key = leaf.space, "/".join(str(part) for part in leaf.path) or "obs"
        if key in skip:
            continue
        where = f"observation leaf {key!r} ({space})"
        if leaf.field is not None or not isinstance(space, SB3_SPACES):
            raise UsageError(f"{where}: SB3 takes Box, Discrete, MultiDiscrete and MultiBinary observations (no strings, "
                             f"no leaf of several fields); leave it out with skip=({key!r},)")
        if isinstance(space, spaces.Discrete) and int(space.start) != 0:
            raise UsageError(f"{where}: SB3 one-hots Discrete observations from 0; start={int(space.start)} would be "
                             "read as another value")
        if isinstance(space, spaces.MultiDiscrete) and (np.any(space.start != 0) or space.nvec.ndim != 1):
            raise UsageError(f"{where}: SB3 takes MultiDiscrete observations with a 1-d nvec starting at 0")
        if isinstance(space, spaces.Box) and space.shape == ():
            space = spaces.Box(space.low.reshape(1), space.high.reshape(1), (1,), space.dtype)
        out[key] = (leaf, space)
    return out


def _leaf(tree: Any, leaf: Any, n: int) -> np.ndarray:
    value = tree
    for key in leaf.path:
        value = value[key]
    return value.reshape(n, 1) if leaf.shape == () and isinstance(leaf.space, spaces.Box) else value
