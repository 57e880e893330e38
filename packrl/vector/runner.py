"""Stepping a block of envs in place: the loop shared by the serial backend and every worker.

Each env writes straight into its rows of the caller's arrays (``set_buffers``). Envs that do
not reset themselves (``autoreset = False``, emulated envs) are reset on the step their episode
ends, keeping that step's rewards and flags: episode ends are never hidden.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from gymnasium import spaces

from packrl.errors import EmulationError
from packrl.vector.actions import action_views

BUFFERS = ("observations", "final_observations", "rewards", "terminals", "truncations", "masks")


@dataclass(frozen=True)
class EnvSpec:
    """What the main process must know about an env before it allocates the shared arrays."""

    agents_per_env: int
    autoreset: bool
    row_shape: tuple
    row_dtype: str
    single_observation_space: spaces.Space
    single_action_space: spaces.Space
    possible_agents: tuple
    emulated: Any

    @classmethod
    def of(cls, env: Any) -> "EnvSpec":
        return cls(int(env.num_agents), bool(getattr(env, "autoreset", False)), tuple(env.observations.shape[1:]),
                   env.observations.dtype.str, env.single_observation_space, env.single_action_space,
                   tuple(getattr(env, "possible_agents", ())), getattr(env, "emulated", None))

    def check(self, env: Any, index: int) -> None:
        """Refuse an env whose rows differ from the first env's: they could not share the arrays."""
        mine = (int(env.num_agents), tuple(env.observations.shape[1:]), env.observations.dtype.str,
                env.single_action_space)
        first = (self.agents_per_env, self.row_shape, self.row_dtype, self.single_action_space)
        if mine != first:
            raise EmulationError(f"env {index} has (num_agents, row shape, row dtype, action space) = {mine}, "
                                 f"env 0 has {first}; all envs of a vector env must match")


def build_env(env_creator: Callable[[], Any]) -> Any:
    """Call the creator; emulate what is not emulated yet."""
    env = env_creator()
    if hasattr(env, "set_buffers") and hasattr(env, "emulated"):
        return env
    from packrl.emulation import emulate

    return emulate(env)


class EnvFailure(Exception):
    """An env raised: carries its global index and the formatted original traceback."""

    def __init__(self, env_index: int, text: str):
        super().__init__(env_index, text)
        self.env_index, self.text = env_index, text


class EnvRunner:
    """Steps envs ``first .. first + len(envs) - 1`` over rows of the full shared arrays."""

    def __init__(self, envs: list, first: int, arrays: dict[str, np.ndarray], spec: EnvSpec):
        self.envs, self.first, self.spec = envs, first, spec
        self.autoreset = spec.autoreset
        self.rows = []
        self.actions = []
        agents = spec.agents_per_env
        for k, env in enumerate(envs):
            rows = slice((first + k) * agents, (first + k + 1) * agents)
            env.set_buffers(*(arrays[name][rows] for name in BUFFERS))
            self.rows.append(rows)
            self.actions.append(action_views(spec.single_action_space, arrays, rows))
        self.current = 0
        self._fast = _GymnasiumBlock(envs, arrays, self.rows) if _GymnasiumBlock.applies(envs) else None

    def reset(self, seed: int | None) -> list:
        """Reset every env (env i with ``seed + i * copies`` when seeded); return [(env index, info)]."""
        infos = []
        for k, env in enumerate(self.envs):
            self.current = k
            index = self.first + k
            env_seed = None if seed is None else seed + index * self._copies(env)
            _, info = env.reset(seed=env_seed)
            if info:
                infos.append((index, info))
        return infos

    def step(self, lo: int = 0, hi: int | None = None) -> list:
        """Step envs ``lo .. hi - 1`` of this block (all by default) with their rows of the action
        arrays; return [(env index, info)] for the non-empty infos."""
        hi = len(self.envs) if hi is None else hi
        if self._fast is not None:
            return self._fast.step(self, lo, hi)
        infos = []
        envs, actions = self.envs, self.actions
        for k in range(lo, hi):
            self.current = k
            env = envs[k]
            info = env.step(actions[k])[4]
            if not self.autoreset and env.done:
                info = self._reset_after_end(env, info)
            if info:
                infos.append((self.first + k, info))
        return infos

    @staticmethod
    def _reset_after_end(env: Any, info: dict) -> dict:
        """Same-step autoreset: the next episode's first observation, this step's rewards and flags."""
        kept = env.rewards.copy(), env.terminals.copy(), env.truncations.copy()
        _, reset_info = env.reset()
        env.rewards[:], env.terminals[:], env.truncations[:] = kept
        if reset_info:
            info = {**info, "reset_info": reset_info}
        return info

    def failure(self) -> EnvFailure:
        """Call inside ``except``: the failing env's global index and the traceback."""
        return EnvFailure(self.first + self.current, traceback.format_exc())

    @staticmethod
    def _copies(env: Any) -> int:
        """Seeds an env consumes: batched envs seed copy j with seed + j."""
        return int(getattr(env, "num_envs", env.num_agents)) if getattr(env, "autoreset", False) else 1

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _GymnasiumBlock:
    """Fast path for single-agent gymnasium envs with a Discrete action: step the raw envs in
    one loop, then check and pack all their observations at once, leaf by leaf, with the
    observation Layout (``pack_batch``), instead of one env at a time. Same checks, same bytes
    as ``GymnasiumEmulation.step``; the per-env numpy calls are what dominate cheap envs."""

    @staticmethod
    def applies(envs: list) -> bool:
        from packrl.emulation.gymnasium_env import GymnasiumEmulation

        return all(type(env) is GymnasiumEmulation for env in envs) and all(
            env.emulated.action.kind == "discrete" for env in envs)

    def __init__(self, envs: list, arrays: dict[str, np.ndarray], rows: list[slice]):
        first = envs[0]
        self.raw = [env.env for env in envs]
        self.start = int(first.emulated.action.discrete_parts[0].start)
        self.layout = first.emulated.observation
        self.passthrough = first.passthrough
        self.codec = self.layout.root.codec if first.passthrough else None
        lo, hi = rows[0].start, rows[-1].stop  # a block's envs own consecutive rows
        self.base = lo
        self.actions = arrays["actions"][lo:hi]
        self.observations = arrays["observations"][lo:hi]
        self.final_observations = arrays["final_observations"][lo:hi]
        self.rewards, self.terminals = arrays["rewards"][lo:hi], arrays["terminals"][lo:hi]
        self.truncations = arrays["truncations"][lo:hi]
        self.flat_dict = _flat_dict_leaves(self.layout)
        self._bound: dict[tuple, Any] = {}

    def _pack_flat_dict(self, obs: list, lo: int, hi: int) -> bool:
        """A Dict of plain leaves: stack each leaf straight into its strided view of the rows
        and check it there (the codec's own check, on the packed values). Returns False to
        leave anything unusual (other keys, other dtypes) to ``pack_batch`` and its errors."""
        keys = self.flat_dict
        if any(type(o) is not dict or len(o) != len(keys) for o in obs):
            return False
        bound = self._bound.get((lo, hi))
        if bound is None:
            bound = self._bound[(lo, hi)] = _leaf_rows(self.layout, self.observations[lo:hi], keys)
        tree, byte_rows = bound
        n = hi - lo
        try:
            columns = [[o[key] for o in obs] for key, _ in keys]
        except KeyError:
            return False
        for (key, codec), column in zip(keys, columns):
            view = tree[key]
            dtype, shape = view.dtype, view.shape[1:]
            if all(type(v) is np.ndarray and v.dtype == dtype and v.shape == shape for v in column):
                rows = byte_rows.get(key)
                if rows is not None and all(v.flags.c_contiguous for v in column):
                    for dst, v in zip(rows, column):  # one flat copy per env beats a strided stack
                        dst[...] = v.reshape(-1).view(np.uint8)
                else:
                    np.stack(column, out=view)  # exact dtype and shape: no cast can happen
                codec.check(view, (key,), (n,))  # bounds and ranges, on the written values
            else:
                view[...] = codec.check(column, (key,), (n,))[0]
        return True

    def step(self, runner: "EnvRunner", lo: int, hi: int) -> list:
        native = self.actions[lo:hi] + self.start  # checked in the main process; decode restores start
        obs, rewards, terminals, truncations, infos = [], [], [], [], {}
        raw = self.raw
        for k in range(lo, hi):
            runner.current = k
            o, r, te, tr, info = raw[k].step(native[k - lo])
            obs.append(o)
            rewards.append(r)
            terminals.append(te)
            truncations.append(tr)
            if info:
                infos[k] = info
        runner.current = lo
        self.rewards[lo:hi] = rewards
        self.terminals[lo:hi] = terminals
        self.truncations[lo:hi] = truncations
        if self.passthrough:
            self.observations[lo:hi] = self.codec.check(np.stack(obs), (), (hi - lo,))[0]
        elif self.flat_dict is None or not self._pack_flat_dict(obs, lo, hi):
            self.layout.pack_batch(obs, out=self.observations[lo:hi])
        for k in np.flatnonzero(np.logical_or(self.terminals[lo:hi], self.truncations[lo:hi])) + lo:
            runner.current = int(k)
            self.final_observations[k] = self.observations[k]
            infos[int(k)] = runner._reset_after_end(runner.envs[k], infos.get(int(k), {}))
        first = runner.first
        return [(first + k, info) for k, info in sorted(infos.items()) if info]


def _flat_dict_leaves(layout: Any) -> list | None:
    """[(key, codec)] when the observation is a Dict of one-field leaves (Box, Discrete,
    MultiDiscrete, MultiBinary); None otherwise."""
    from packrl.emulation.layout import DictNode, LeafNode

    root = layout.root
    if type(root) is not DictNode or not all(type(c) is LeafNode and len(c.codec.fields) == 1 for c in root.children):
        return None
    if any(c.codec.kind not in ("box", "discrete", "multidiscrete", "multibinary") for c in root.children):
        return None
    return [(key, child.codec) for key, child in zip(root.keys, root.children)]


def _leaf_rows(layout: Any, rows: np.ndarray, keys: list) -> tuple[dict, dict]:
    """The leaf views of ``rows`` by key, and for large leaves each row's bytes of that leaf."""
    tree = layout.bind(rows).tree
    byte_rows = {}
    for leaf in layout.leaves:
        if leaf.nbytes >= 1024:
            region = rows[:, leaf.offset: leaf.offset + leaf.nbytes]
            byte_rows[leaf.path[0]] = [region[i] for i in range(len(rows))]
    return tree, byte_rows
