"""Stepping a block of envs in place: the loop shared by the serial backend and every worker.

Each env writes straight into its rows of the caller's arrays (``set_buffers``). Envs that do
not reset themselves (``autoreset = False``, emulated envs) are reset on the step their episode
ends, keeping that step's rewards and flags: episode ends are never hidden. With another autoreset
mode (``packrl.vector.autoreset``) the shared ``ended`` array (one flag per env) says which envs
ended at their last step: NEXT_STEP resets those at their next step, DISABLED leaves them to
``reset`` with a mask.
"""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from gymnasium import spaces

from packrl.emulation import emulate
from packrl.env_protocol import ROW_BUFFERS, BlockPosition, block_stepper
from packrl.errors import EnvError, UsageError
from packrl.vector.actions import action_views
from packrl.vector.autoreset import NEXT_STEP, SAME_STEP


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
            raise UsageError(f"env {index} has (num_agents, row shape, row dtype, action space) = {mine}, "
                                 f"env 0 has {first}; all envs of a vector env must match")


def build_env(env_creator: Callable[[], Any]) -> Any:
    """Call the creator; emulate what is not emulated yet."""
    env = env_creator()
    if hasattr(env, "set_buffers") and hasattr(env, "emulated"):
        return env
    return emulate(env)


class EnvFailure(Exception):
    """An env raised: carries its global index, the formatted original traceback and the qualified class
    name of what it raised (``EnvError``'s fields, sent as they are from a worker or an actor)."""

    def __init__(self, env_index: int, text: str, exception: str = ""):
        super().__init__(env_index, text, exception)
        self.env_index, self.text, self.exception = env_index, text, exception

    @property
    def fields(self) -> dict:
        """The ``EnvError`` keyword fields of this failure."""
        return {"env_index": self.env_index, "env_traceback": self.text, "env_exception": self.exception or None}


def raised_name() -> str:
    """Call inside ``except``: the qualified class name of the exception being handled."""
    kind = sys.exc_info()[0]
    return "" if kind is None else f"{kind.__module__}.{kind.__qualname__}"


class EnvRunner:
    """Steps envs ``first .. first + len(envs) - 1`` over rows of the full shared arrays."""

    def __init__(self, envs: list, first: int, arrays: dict[str, np.ndarray], spec: EnvSpec,
                 autoreset_mode: Any = SAME_STEP):
        self.envs, self.first, self.spec = envs, first, spec
        self.autoreset = spec.autoreset
        self.mode = autoreset_mode
        self.ended = arrays.get("ended")  # per env: its episode ended at its last step (modes other than SAME_STEP)
        self.rows = []
        self.actions = []
        agents = spec.agents_per_env
        for k, env in enumerate(envs):
            rows = slice((first + k) * agents, (first + k + 1) * agents)
            env.set_buffers(*(arrays[name][rows] for name in ROW_BUFFERS))
            self.rows.append(rows)
            self.actions.append(action_views(spec.single_action_space, arrays, rows))
        self.current = 0
        step_many = block_stepper(envs)
        self._block = None if step_many is None else _Block(step_many, envs, arrays, self.rows)

    def reset(self, seed: int | None, mask: np.ndarray | None = None) -> list:
        """Reset every env, or those whose index is true in ``mask`` (one flag per env of the vector env),
        env i with ``seed + i * copies`` when seeded; return [(env index, info)]."""
        infos = []
        for k, env in enumerate(self.envs):
            index = self.first + k
            if mask is not None and not mask[index]:
                continue
            self.current = k
            env_seed = None if seed is None else seed + index * seeds_per_env(env)
            _, info = env.reset(seed=env_seed)
            if self.ended is not None:
                self.ended[index] = False
            if info:
                infos.append((index, info))
        return infos

    def step(self, lo: int = 0, hi: int | None = None) -> list:
        """Step envs ``lo .. hi - 1`` of this block (all by default) with their rows of the action
        arrays; return [(env index, info)] for the non-empty infos."""
        hi = len(self.envs) if hi is None else hi
        if self.mode != SAME_STEP:
            return self._step_later_reset(lo, hi)
        if self._block is not None:
            return self._block.step(self, lo, hi)
        infos = []
        envs, actions = self.envs, self.actions
        for k in range(lo, hi):
            self.current = k
            env = envs[k]
            info = env.step(actions[k])[4]
            if not self.autoreset and env.done:
                info = reset_after_end(env, info)
            if info:
                infos.append((self.first + k, info))
        return infos

    def _step_later_reset(self, lo: int, hi: int) -> list:
        """NEXT_STEP and DISABLED: an env whose episode ends keeps its last observation in ``observations``
        and is marked in ``ended``. NEXT_STEP resets a marked env instead of stepping it (its action is
        ignored; reward 0, flags false, the reset info as its info), as gymnasium's SyncVectorEnv does.
        DISABLED never gets a marked env here: the backend refuses the step first (naming the env)."""
        infos = []
        envs, actions, ended, next_step = self.envs, self.actions, self.ended, self.mode == NEXT_STEP
        for k in range(lo, hi):
            self.current = k
            env, index = envs[k], self.first + k
            if ended[index]:
                if not next_step:
                    raise UsageError(f"env {index}'s episode ended at its last step and autoreset_mode is DISABLED:"
                                     " reset it with reset(options={'reset_mask': mask}) before stepping it")
                _, info = env.reset()
                env.rewards[:], env.terminals[:], env.truncations[:] = 0.0, False, False
                ended[index] = False
            else:
                info = env.step(actions[k])[4]
                if env.done:
                    ended[index] = True
                    # the step that ends the episode returns its last observation on every row that ended
                    # (a PettingZoo env leaves an ended agent's row zero and its last observation in final_observations)
                    rows = env.terminals | env.truncations
                    env.observations[rows] = env.final_observations[rows]
            if info:
                infos.append((index, info))
        return infos

    def failure(self) -> EnvFailure:
        """Call inside ``except``: the failing env's global index and the traceback."""
        return EnvFailure(self.first + self.current, traceback.format_exc(), raised_name())

    def close(self) -> None:
        """Close every env; if some env's own ``close`` raised, say which after closing the rest."""
        raise_close_errors(close_envs(self.envs, self.first))


def close_envs(envs: list, first: int) -> list[tuple[int, str]]:
    """Close every env (the list is emptied); (env index, error) for each whose own ``close`` raised.
    The errors are text, so a worker or an actor can send them to the main process."""
    errors = []
    for k, env in enumerate(envs):
        try:
            env.close()
        except Exception as err:  # noqa: BLE001 - the other envs must still be closed
            errors.append((first + k, f"{type(err).__name__}: {err}"))
    envs.clear()
    return errors


def raise_close_errors(errors: list[tuple[int, str]]) -> None:
    """EnvError naming the first env whose close raised (``close_envs``), if any did."""
    if errors:
        index, text = min(errors)
        others = f" (and {len(errors) - 1} more envs)" if len(errors) > 1 else ""
        raise EnvError(f"env {index}'s close raised {text}{others}; every env was closed all the same", env_index=index)


class _Block:
    """Envs of one class and layout stepped together through their class's ``step_many``
    (``packrl.env_protocol.BlockStepper``; the gymnasium emulation packs the observations leaf
    by leaf across the block), then reset where their episode ended."""

    def __init__(self, step_many: Callable, envs: list, arrays: dict[str, np.ndarray], rows: list[slice]):
        self.step_many = step_many
        self.arrays = arrays
        self.base = rows[0].start  # a block's envs own consecutive rows, one each
        self.action_space = envs[0].single_action_space  # the block's action rows go over as arrays
        self._rows: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self.position = BlockPosition()

    def step(self, runner: "EnvRunner", lo: int, hi: int) -> list:
        rows = self._rows.get((lo, hi))
        if rows is None:  # the same views every step, so the Layout's cached leaf views are reused
            rows = self._rows[(lo, hi)] = {name: self.arrays[name][self.base + lo: self.base + hi]
                                           for name in ROW_BUFFERS[:-1]}
        position = self.position
        position.index = 0
        try:
            actions = action_views(self.action_space, self.arrays, slice(self.base + lo, self.base + hi))
            infos, ended = self.step_many(runner.envs[lo:hi], actions, rows, position)
        except BaseException:  # KeyboardInterrupt too: the backend names the env it stopped
            runner.current = lo + position.index
            raise
        for k in ended:
            runner.current = lo + int(k)
            infos[k] = reset_after_end(runner.envs[lo + k], infos[k])
        return [(runner.first + lo + k, info) for k, info in enumerate(infos) if info]


def reset_after_end(env: Any, info: dict) -> dict:
    """Same-step autoreset: the next episode's first observation, this step's rewards and flags."""
    kept = env.rewards.copy(), env.terminals.copy(), env.truncations.copy()
    _, reset_info = env.reset()
    env.rewards[:], env.terminals[:], env.truncations[:] = kept
    if reset_info:
        info = {**info, "reset_info": reset_info}
    return info


def seeds_per_env(env: Any) -> int:
    """Seeds an env consumes: batched envs seed copy j with seed + j."""
    return int(getattr(env, "num_envs", env.num_agents)) if getattr(env, "autoreset", False) else 1
