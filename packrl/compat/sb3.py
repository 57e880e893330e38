"""A packrl vector env as a Stable-Baselines3 ``VecEnv``: ``as_sb3(vector.make(...))``.

Observations are what SB3 expects of the space it is shown:

- ``observations="rows"`` (the default for envs whose observation is a Box): the rows as they are,
  ``(num_envs, *shape)`` of the Box's dtype.
- ``observations="leaves"`` (the default for structured envs): a one-level ``spaces.Dict`` with one
  key per leaf of the Layout (its path, e.g. ``"image"`` or ``"agent/position"``), each the leaf's
  own space and exact dtype, unpacked from the rows (``Layout.unpack``; nothing promoted to float).
  SB3's ``MultiInputPolicy`` takes it as it takes any Dict observation (its ``DictRolloutBuffer``
  keeps each key's dtype; its feature extractor one-hots Discrete leaves and floats Boxes).

Multi-agent envs (PettingZoo Parallel envs, ``emulate(env, agents="tuple")``) give SB3 one env per agent
row, ``num_envs * agents_per_env`` in all, as SuperSuit's ``pettingzoo_env_to_vec_env_v1`` +
``concat_vec_envs_v1`` recipe does (row ``e * agents_per_env + i`` is agent ``possible_agents[i]`` of env
``e``; each row's info is that agent's entry of its env's info). An agent that is gone reads zeros with
reward 0 until its env resets, as SuperSuit's ``black_death_v3`` gives; unlike black_death, its own end is
not hidden: its row is done once, on the step it ended, with its ``terminal_observation``. SB3 rows need
one observation and action space: agents whose spaces differ are refused, naming them; so are AEC envs
(emulated turn by turn, their rows hold only the acting agent).

Each step returns copies (SB3 keeps the previous observation while the envs step on), sets
``infos[i]["TimeLimit.truncated"]`` (truncated and not terminated) and, where an episode ended,
``infos[i]["terminal_observation"]`` from ``final_observations`` in the same form; the reset info
of a same-step autoreset goes to ``reset_infos[i]``, as in SB3's own VecEnvs. ``seed()`` then
``reset()`` seeds env i with ``seed + i``, as SB3 and packrl both do (for multi-agent envs: packrl's env
``e``, all its agent rows, with ``seed + e``, as SuperSuit's ``concat_vec_envs_v1`` does).
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices

from packrl.errors import UsageError
from packrl.vector.attrs import WRAPPERS, Request, checked
from packrl.vector.autoreset import SAME_STEP
from packrl.vector.infos import RESET_INFO

OBSERVATIONS = ("rows", "leaves")


def as_sb3(venv: Any, observations: str | None = None, skip: tuple = ()) -> "PackrlVecEnv":
    """``venv`` (from ``packrl.vector.make``; every env stepped at once) as an SB3 VecEnv with one env
    per agent row. ``observations``: ``"rows"``, ``"leaves"`` or None (rows for a Box observation, leaves
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
        self._agents = _row_agents(venv)
        if self._agents:
            _refuse_turn_based(venv)
        super().__init__(venv.num_agents, space, venv.single_action_space)

    # ------------------------------------------------------------ stepping

    def reset(self) -> Any:
        if any(self._options):
            raise UsageError("packrl vector envs take no reset options (set_options)")
        obs, infos = self.venv.reset(seed=self._seeds[0])
        self.reset_infos = self._per_row(infos)
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
        reset_infos = self._per_row(infos, RESET_INFO) if self._agents else None
        for i, info in enumerate(self._per_row(infos)):
            info["TimeLimit.truncated"] = bool(truncations[i] and not terminals[i])
            if dones[i]:
                info["terminal_observation"] = self._observe_one(self.venv.final_observations[i])
                self.reset_infos[i] = info.pop(RESET_INFO, {})
            if reset_infos is not None and reset_infos[i]:  # this agent's env was reset at this step
                self.reset_infos[i] = reset_infos[i]
            out.append(info)
        return self._observe(obs), rewards.copy(), dones.copy(), out

    def _per_row(self, infos: Any, key: str | None = None) -> list[dict]:
        """One info dict per SB3 env (a copy): the env's info, or for multi-agent envs that agent's
        entry of its env's info (of its ``key`` entry: the reset info of a same-step autoreset)."""
        per_env = _per_env(infos, self.venv.num_envs)
        if not self._agents:
            return [dict(info) for info in per_env]
        out = []
        for row, agent in enumerate(self._agents * self.venv.num_envs):
            info = per_env[row // len(self._agents)]
            if key is not None:
                info = info.get(key, {})
            entry = info.get(agent, {}) if isinstance(info, dict) else {}
            out.append(dict(entry) if isinstance(entry, dict) else {})
        return out

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
        images = list(self.venv.render())
        return [images[row // self._per_env] for row in range(self.num_envs)]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        if attr_name == "render_mode" and not hasattr(self.venv, "call_envs"):
            return [None] * self.num_envs  # Numba copies render nothing
        return self._on(Request(attr_name, call=False), indices)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        targets = self._get_indices(indices)
        self._on(Request(attr_name, call=False, values=tuple(value for _ in range(self.venv.num_envs))), targets)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list:
        return self._on(Request(method_name, method_args, method_kwargs), indices)

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [any(issubclass(t, wrapper_class) for t in types) for types in self._on(Request(WRAPPERS), indices)]

    @property
    def _per_env(self) -> int:
        return len(self._agents) or 1

    def _on(self, request: Request, indices: VecEnvIndices) -> list:
        """Run ``request`` on the envs holding the rows of ``indices`` (each env once, however many of its
        agent rows are named); one result per row, its env's, in that order."""
        if not hasattr(self.venv, "call_envs"):
            raise UsageError(f"{request.name!r}: the copies of a Numba env are rows of one compiled state, not env objects")
        rows = list(self._get_indices(indices))
        for row in rows:
            if not 0 <= row < self.num_envs:
                raise UsageError(f"indices: {row} is not an env of this VecEnv (0..{self.num_envs - 1})")
        if request.name in ("reset", "step", "close", "set_buffers"):
            raise UsageError(f"env_method({request.name!r}) would reach the envs behind the vector env's back")
        envs = sorted({row // self._per_env for row in rows})
        only = None if len(envs) == self.venv.num_envs else frozenset(envs)
        results = checked(self.venv.call_envs(Request(request.name, request.args, request.kwargs, request.call,
                                                       request.values, only)))
        return [results[row // self._per_env] for row in rows]

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
    if getattr(venv, "emulated", None) is not None and venv.emulated.heterogeneous:
        raise UsageError(f"as_sb3: {_how_groups_differ(venv.emulated)}; SB3 rows share one observation and "
                         "action space (pad them to one, e.g. with SuperSuit's pad_observations_v0/pad_action_space_v0)")
    if getattr(venv, "batch_size", venv.num_envs) != venv.num_envs:
        raise UsageError(f"as_sb3: batch_size={venv.batch_size} < num_envs={venv.num_envs}; SB3 steps every env at once")
    if getattr(venv, "info_format", "list") != "list":
        raise UsageError("as_sb3 reads infos as one dict per env: make the vector env with infos='list' (the default)")
    mode = getattr(venv, "metadata", {}).get("autoreset_mode", SAME_STEP)
    if mode != SAME_STEP:  # SB3's VecEnvs reset on the step an episode ends, its final observation in the info
        raise UsageError(f"as_sb3 needs autoreset_mode SAME_STEP (SB3 resets on the step an episode ends), got {mode}")
    action = venv.single_action_space
    if not isinstance(action, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Box)):
        raise UsageError(f"as_sb3: SB3 has no policy for the action space {action} (packrl's hybrid discrete + "
                         "continuous actions); use packrl.train.PPO")


def _row_agents(venv: Any) -> list:
    """The agent of each row of one env for multi-agent envs (PettingZoo's possible_agents); [] for
    single-agent envs, whose info is the env's own."""
    if getattr(venv, "agents_per_env", 1) == 1 and not getattr(venv, "possible_agents", ()):
        return []
    return list(venv.possible_agents)


def _refuse_turn_based(venv: Any) -> None:
    """A PettingZoo AEC env's rows hold only the acting agent; SB3 would train on every waiting row."""
    if not hasattr(venv, "call_envs"):
        return
    try:
        from pettingzoo import AECEnv
    except ImportError:  # an optional extra: without it there is no AEC env (agents="tuple" envs are gymnasium's)
        return

    types = checked(venv.call_envs(Request(WRAPPERS, only=frozenset([0]))))[0]
    if issubclass(types[0], AECEnv):
        raise UsageError(f"as_sb3: env 0 is a PettingZoo AEC env ({types[-1].__module__}.{types[-1].__name__}), "
                         "emulated turn by turn: its rows hold only the acting agent, while SB3's rows all act every "
                         "step; give its Parallel form (parallel_env(), or pettingzoo's aec_to_parallel)")


def _how_groups_differ(emulated: Any) -> str:
    """One line naming two agents whose spaces differ and how."""
    first, other = emulated.groups[0], emulated.groups[1]
    a, b = first.agents[0], other.agents[0]
    parts = []
    if first.observation != other.observation:
        parts.append(f"observation space {first.observation.space} vs {other.observation.space}")
    if first.action != other.action:
        parts.append(f"action space {first.action.space} vs {other.action.space}")
    return f"agents {a!r} and {b!r} differ in {' and '.join(parts)}"


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
