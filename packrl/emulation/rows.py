"""The rows every emulation writes: its buffers, how an observation gets into a row (packed, or a
lone Box passed through as itself: ``row_format``). ``EmulatedRows`` is the base of the gymnasium,
PettingZoo Parallel and AEC emulations (each a ``packrl.env_protocol.RowEnv``)."""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from packrl.emulation.emulated import Emulated
from packrl.env_protocol import BlockPosition
from packrl.errors import EmulationError, ObservationError


def row_format(emulated: Emulated) -> tuple[bool, spaces.Box, tuple, np.dtype]:
    """(passes through, single observation space, row shape, row dtype) of an env with these layouts:
    one group whose layout is a lone Box (``Layout.box``) keeps the Box as its rows; anything else
    is packed into ``emulated.nbytes`` uint8 bytes (the emulations and the Numba envs read this)."""
    first = emulated.groups[0].observation
    if not emulated.heterogeneous and first.box is not None:
        return True, first.space, tuple(first.box.shape), np.dtype(first.box.dtype)
    return False, spaces.Box(0, 255, (emulated.nbytes,), np.uint8), (emulated.nbytes,), np.dtype(np.uint8)


class BoxRow:
    """A pass-through row: ``pack(obs)`` checks a value against the Box and writes it into the
    row's typed view (the same call as a bound layout's ``pack``, so callers do not branch)."""

    __slots__ = ("codec", "view")

    def __init__(self, codec: Any, view: np.ndarray):
        self.codec, self.view = codec, view

    def pack(self, obs: Any) -> None:
        try:
            self.view[...] = self.codec.check(obs, ())[0]
        except EmulationError as err:
            raise self.codec.refused(err) from None


class EmulatedRows:
    """Buffers, layouts and per-row writers of an emulated env (``packrl.env_protocol.RowEnv``).

    Buffers: ``observations`` and ``final_observations`` (``(num_agents, *row_shape)``),
    ``rewards`` float32, ``terminals``, ``truncations``, ``masks`` bool. ``set_buffers`` points
    them at someone else's rows (a vector backend's shared memory). Emulated envs do not reset
    themselves (``autoreset = False``): the caller resets on the step ``done`` turns true."""

    autoreset = False

    def __init__(self, env: Any, emulated: Emulated, single_action_space: spaces.Space, finite_rewards: bool):
        self.env = env
        self.finite_rewards = bool(finite_rewards)
        self.emulated = emulated
        self.num_agents = len(emulated.agents)
        self._row_groups = tuple(emulated.groups[g] for g in emulated.row_group)
        self.passthrough, self.single_observation_space, row_shape, row_dtype = row_format(emulated)
        observations = np.zeros((self.num_agents, *row_shape), dtype=row_dtype)
        self.single_action_space = single_action_space
        n = self.num_agents
        self.set_buffers(observations, np.zeros_like(observations), np.zeros(n, np.float32), np.zeros(n, bool),
                         np.zeros(n, bool), np.zeros(n, bool))

    def set_buffers(self, observations: np.ndarray, final_observations: np.ndarray, rewards: np.ndarray,
                    terminals: np.ndarray, truncations: np.ndarray, masks: np.ndarray) -> None:
        """Write into rows owned by someone else (a vector backend's shared memory)."""
        for name, buf in (("observations", observations), ("final_observations", final_observations)):
            if buf.shape[0] != self.num_agents or buf.dtype != self.single_observation_space.dtype:
                raise EmulationError(f"{name} buffer must be ({self.num_agents}, ...) "
                                     f"{self.single_observation_space.dtype}, got {buf.shape} {buf.dtype}")
        self.observations, self.final_observations = observations, final_observations
        self.rewards, self.terminals, self.truncations, self.masks = rewards, terminals, truncations, masks
        self._obs_rows = self._row_writers(observations)
        self._final_rows = self._row_writers(final_observations)

    def __getstate__(self) -> dict:
        # the row writers are views of the buffers; pickled apart from them, a copy would write its rows into
        # arrays nobody reads (all-zero observations): rebuilt from the copy's own buffers in __setstate__
        return {k: v for k, v in self.__dict__.items() if k not in ("_obs_rows", "_final_rows")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._obs_rows = self._row_writers(self.observations)
        self._final_rows = self._row_writers(self.final_observations)

    def _row_writers(self, buf: np.ndarray) -> list:
        """Per row, an object whose ``pack(obs)`` checks one observation and writes it into that row."""
        if self.passthrough:
            codec = self.emulated.observation.root.codec
            return [BoxRow(codec, buf[row, ...]) for row in range(self.num_agents)]  # 0-d rows stay views
        return [group.observation.bind(buf[row, : group.observation.nbytes])
                for row, group in enumerate(self._row_groups)]

    def pack_block(self, observations: tuple, out: np.ndarray, position: BlockPosition) -> None:
        """Check and write one observation per env of a block (envs of this one's layout, one row
        each) into ``out``, leaf by leaf across the block (``Layout.pack_rows``) or, passed through,
        as one checked array. On a refusal ``position.index`` names the env that returned it."""
        layout = self.emulated.observation
        try:
            if self.passthrough:
                out[:] = _stacked(layout.root.codec, observations, position)
                return
            try:  # straight into the rows: if an observation is refused, the env fails and its rows are void
                layout.pack_rows(list(observations), out)
            except EmulationError:
                position.index = _first_refused(layout, observations)
                raise
        except EmulationError as err:
            raise ObservationError(str(err)) from err

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped


def _first_refused(layout: Any, observations: tuple) -> int:
    """Position of the first observation the layout refuses alone (the error path of a block pack, which
    reports the block's sample index in its message: this names the env that returned it)."""
    for k, obs in enumerate(observations):
        try:
            layout.pack(obs)
        except EmulationError:
            return k
    return 0


def _stacked(codec: Any, observations: tuple, position: BlockPosition) -> np.ndarray:
    """The Box observations of a block, checked as one array. np.array stacks equal-shaped arrays
    in a quarter of np.stack's time; where they do not stack, each is checked alone so that the
    error names the env (``position``)."""
    try:
        stacked = np.array(observations)
    except ValueError:
        stacked = None
    if stacked is None or stacked.dtype == object:
        for k, obs in enumerate(observations):
            try:
                codec.check(obs, ())
            except EmulationError as err:
                position.index = k
                raise codec.refused(err) from None
            except Exception:
                position.index = k
                raise
        stacked = np.array(observations)
    try:
        return codec.check(stacked, (), (len(observations),))[0]
    except EmulationError as err:
        raise codec.refused(err) from None
