"""A single-agent gymnasium env seen as one packed row (num_agents = 1)."""
from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from packrl.emulation.actions import fast_decode
from packrl.emulation.emulated import group_agents
from packrl.emulation.rows import EmulatedRows
from packrl.emulation.step_checks import (
    F32_MAX,
    MULTI_AGENT_HINT,
    checked_flag,
    checked_info,
    checked_reset,
    checked_reward,
    checked_step,
    old_api_error,
)
from packrl.env_protocol import BlockPosition
from packrl.errors import EmulationError, ObservationError

AGENT = "agent_0"
_NONE_ENDED = np.zeros(0, dtype=np.intp)
_F64 = np.float64  # a float subclass, the reward of Pendulum and many NumPy envs: taken inline as a float is


class GymnasiumEmulation(EmulatedRows):
    """Wraps a gymnasium.Env: observations packed into ``observations[0]``, actions decoded from
    the policy's flat form into the env's native structure.

    Buffers as ``EmulatedRows`` (one row; ``masks`` always true; ``final_observations`` written on
    the step an episode ends). After an end, call ``reset`` (vector backends do it in the same step).

    Rewards and flags are checked (``packrl.emulation.step_checks``); ``finite_rewards=False``
    lets an env return rewards that are not finite in float32.
    """

    def __init__(self, env: gymnasium.Env, round_floats: bool = False, finite_rewards: bool = True):
        self.possible_agents = (AGENT,)
        self.agents = (AGENT,)
        emulated = group_agents(self.possible_agents, {AGENT: env.observation_space}, {AGENT: env.action_space},
                                round_floats)
        super().__init__(env, emulated, emulated.action.policy_space, finite_rewards)
        self._action_spec = self.emulated.action.spec  # the C decoder's, for every action kind

    def set_buffers(self, observations: np.ndarray, final_observations: np.ndarray, rewards: np.ndarray,
                    terminals: np.ndarray, truncations: np.ndarray, masks: np.ndarray) -> None:
        super().set_buffers(observations, final_observations, rewards, terminals, truncations, masks)
        self.masks[:] = True  # the one agent acts on every step
        self._packer = self._obs_rows[0]

    def __getstate__(self) -> dict:
        # the C decoder's capsule does not pickle, and the packer is a view of the buffers: both rebuilt
        return {k: v for k, v in super().__getstate__().items() if k not in ("_action_spec", "_packer")}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._action_spec = self.emulated.action.spec
        self._packer = self._obs_rows[0]

    @property
    def done(self) -> bool:
        """True after the step that ended the episode (terminated or truncated)."""
        return bool(self.terminals[0] or self.truncations[0])

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        try:
            result = self.env.reset(seed=seed, options=options)
        except ValueError as err:  # a gymnasium wrapper unpacking an old-API env: named, else the env's own error
            named = old_api_error(err, self.env, "reset")
            if named is None:
                raise
            raise named from err
        if type(result) is not tuple or len(result) != 2 or type(result[1]) is not dict:
            result = checked_reset(result, self.env)
        obs, info = result
        try:
            self._packer.pack(obs)
        except EmulationError as err:
            raise ObservationError(str(err)) from err
        self.rewards[0] = 0.0
        self.terminals[0] = self.truncations[0] = False
        return self.observations, info

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        native = fast_decode(self._action_spec, actions)  # the commonest forms, checked, in one C call
        if native is None:
            native = self.emulated.action.checked_decode(_single(actions, self.emulated.action.kind),
                                                         who=f" (agent {AGENT})")
        try:
            result = self.env.step(native)
        except ValueError as err:  # a gymnasium wrapper unpacking an old-API env: named, else the env's own error
            named = old_api_error(err, self.env, "step")
            if named is None:
                raise
            raise named from err
        if type(result) is not tuple or len(result) != 5:
            result = checked_step(result, self.env)
        obs, reward, terminated, truncated, info = result
        if type(info) is not dict:
            info = checked_info(info, self.env)
        # the common case inline, in the cheapest tests there are (the bounds are F32_MAX, as literals: no
        # global lookups); anything else is checked, and converted or refused, by step_checks
        if (type(reward) is not float and type(reward) is not int and type(reward) is not _F64) \
                or not -3.4028234663852886e+38 <= reward <= 3.4028234663852886e+38:
            reward = checked_reward(reward, self.env, self.finite_rewards, hint=MULTI_AGENT_HINT)
        if terminated is not False and terminated is not True:
            terminated = checked_flag(terminated, "terminated", self.env, hint=MULTI_AGENT_HINT)
        if truncated is not False and truncated is not True:
            truncated = checked_flag(truncated, "truncated", self.env, hint=MULTI_AGENT_HINT)
        try:  # the row writer (BoundRows or BoxRow): the compiled pack, else the checked Python path
            self._packer.pack(obs)
        except EmulationError as err:
            raise ObservationError(str(err)) from err
        self.rewards[0] = reward
        self.terminals[0] = terminated
        self.truncations[0] = truncated
        if terminated or truncated:
            self.final_observations[0] = self.observations[0]
        return self.observations, self.rewards, self.terminals, self.truncations, info

    @staticmethod
    def step_many(envs: list["GymnasiumEmulation"], actions: Any, rows: dict[str, np.ndarray],
                  position: BlockPosition) -> tuple[list[dict], np.ndarray]:
        """``packrl.env_protocol.BlockStepper.step_many``: same checks and bytes as ``step`` on each
        env, but the observations are packed leaf by leaf across the block (``Layout.pack_rows``):
        one stack and one check per leaf instead of one per leaf and env. ``actions``: one policy
        action per env (a list, or the block's rows of the action arrays)."""
        first = envs[0]
        action_layout = first.emulated.action
        if isinstance(actions, list):  # one action per env
            natives = [env.emulated.action.decode(_single(a, action_layout.kind), who=f" (env {k} of the block)")
                       for k, (env, a) in enumerate(zip(envs, actions))]
        else:  # the block's rows of the action arrays, decoded in one call
            natives = action_layout.decode_batch(actions, who=" (env {} of the block)")
        results = []
        try:
            for env, native in zip(envs, natives):
                results.append(env.env.step(native))
        except BaseException as err:  # KeyboardInterrupt too: the caller names the env it stopped
            position.index = len(results)
            if isinstance(err, ValueError):  # a gymnasium wrapper unpacking an old-API env: named
                named = old_api_error(err, envs[len(results)].env, "step")
                if named is not None:
                    raise named from err
            raise
        if not all([type(r) is tuple and len(r) == 5 and type(r[4]) is dict for r in results]):
            _check_block_results(envs, results, position)
        observations, rewards, terminals, truncations, infos = zip(*results)
        rewards, terminals, truncations = _checked_block(envs, rewards, terminals, truncations, position)
        rows["rewards"][:] = rewards
        rows["terminals"][:] = terminals
        rows["truncations"][:] = truncations
        first.pack_block(observations, rows["observations"], position)
        ended = _NONE_ENDED
        if any(terminals) or any(truncations):  # the Python flags: cheaper than a mask on most steps
            ended = np.flatnonzero(rows["terminals"] | rows["truncations"])
            rows["final_observations"][ended] = rows["observations"][ended]
        return list(infos), ended



def _check_block_results(envs: list, results: list, position: BlockPosition) -> None:
    """Refuse the first step result of a block that is not 5 values with a dict info (naming its env)."""
    for k, (env, result) in enumerate(zip(envs, results)):
        try:
            checked_info(checked_step(result, env.env)[4], env.env)
        except EmulationError:
            position.index = k
            raise


def _checked_block(envs: list, rewards: tuple, terminals: tuple, truncations: tuple, position: BlockPosition) -> tuple:
    """The rewards and flags of a block step, checked as ``step`` checks them (one pass over the
    common case; an error carries the position of the env that returned the value)."""
    if all([(type(r) is float or type(r) is int or type(r) is _F64) and -F32_MAX <= r <= F32_MAX for r in rewards]) and \
            all([t is False or t is True for t in terminals]) and all([t is False or t is True for t in truncations]):
        return rewards, terminals, truncations
    checked = ([], [], [])
    for k, (env, reward, terminated, truncated) in enumerate(zip(envs, rewards, terminals, truncations)):
        try:
            checked[0].append(checked_reward(reward, env.env, env.finite_rewards, hint=MULTI_AGENT_HINT))
            checked[1].append(checked_flag(terminated, "terminated", env.env, hint=MULTI_AGENT_HINT))
            checked[2].append(checked_flag(truncated, "truncated", env.env, hint=MULTI_AGENT_HINT))
        except EmulationError:
            position.index = k
            raise
    return checked


def _single(actions: Any, kind: str) -> Any:
    """Accept one agent's action with or without the leading (1,) agent axis."""
    if kind == "hybrid":
        if not isinstance(actions, dict):
            raise EmulationError(f"hybrid action must be a dict with 'discrete' and 'continuous', got {actions!r}")
        return {k: np.asarray(v)[0] if np.ndim(v) == 2 else v for k, v in actions.items()}
    if kind == "discrete" and isinstance(actions, (int, np.integer)):
        return actions
    arr = np.asarray(actions)
    if kind == "discrete":
        if arr.size != 1:
            raise EmulationError(f"expected one discrete action for agent {AGENT}, got shape {arr.shape}")
        return arr.reshape(-1)[0]
    return arr[0] if arr.ndim == 2 and arr.shape[0] == 1 else arr
