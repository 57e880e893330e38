"""emulate(env): the one entry point from a third-party env to packed rows."""
from __future__ import annotations

from typing import Any

import gymnasium

from packrl.errors import EmulationError


def emulate(env: Any, round_floats: bool = False, action_mask_key: str | None = "action_mask") -> Any:
    """Wrap a gymnasium.Env, a PettingZoo ParallelEnv or a PettingZoo AECEnv (see DESIGN.md).

    ``round_floats`` allows float64 observations into float32 leaves (refused by default);
    ``action_mask_key`` names the observation leaf that masks actions (None: no mask)."""
    if isinstance(env, gymnasium.Env):
        from packrl.emulation.gymnasium_env import GymnasiumEmulation

        return GymnasiumEmulation(env, round_floats=round_floats)
    try:
        from pettingzoo.utils.env import AECEnv, ParallelEnv
    except ImportError:  # pragma: no cover - pettingzoo is a dependency
        AECEnv = ParallelEnv = ()
    if isinstance(env, ParallelEnv):
        from packrl.emulation.pettingzoo_env import ParallelEmulation

        return ParallelEmulation(env, round_floats=round_floats, action_mask_key=action_mask_key)
    if isinstance(env, AECEnv):
        from packrl.emulation.pettingzoo_env import AECEmulation

        return AECEmulation(env, round_floats=round_floats, action_mask_key=action_mask_key)
    raise EmulationError(
        f"emulate takes a gymnasium.Env, a PettingZoo ParallelEnv or AECEnv; got {type(env).__module__}.{type(env).__name__}")
