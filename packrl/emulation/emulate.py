"""emulate(env): the one entry point from a third-party env to packed rows."""
from __future__ import annotations

from typing import Any

import gymnasium

from packrl.emulation.gymnasium_env import GymnasiumEmulation
from packrl.emulation.pettingzoo_env import AECEmulation, ParallelEmulation
from packrl.emulation.tuple_agents import TupleAgents
from packrl.errors import EmulationError

AGENTS_OPTIONS = (None, "tuple")


def emulate(env: Any, round_floats: bool = False, action_mask_key: str | None = "action_mask",
            finite_rewards: bool = True, agents: str | None = None) -> Any:
    """Wrap a gymnasium.Env, a PettingZoo ParallelEnv or a PettingZoo AECEnv (see DESIGN.md).

    ``round_floats`` allows float64 observations into float32 leaves (refused by default);
    ``action_mask_key`` names the observation leaf that masks actions (None: no mask);
    ``finite_rewards=False`` accepts rewards that are not finite in float32 (refused by default);
    ``agents="tuple"``: a gymnasium.Env that holds several agents, one per entry of its top-level
    Tuple observation and action spaces, with per-agent reward lists (and a shared end flag or
    per-agent flag lists), emulated with one row per agent (``packrl.emulation.tuple_agents``)."""
    if agents not in AGENTS_OPTIONS:
        raise EmulationError(f"agents={agents!r}: choose None (one agent) or 'tuple' (one agent per Tuple entry)")
    multi = {"round_floats": round_floats, "action_mask_key": action_mask_key, "finite_rewards": finite_rewards}
    if isinstance(env, gymnasium.Env):
        if agents == "tuple":
            return ParallelEmulation(TupleAgents(env), **multi)
        return GymnasiumEmulation(env, round_floats=round_floats, finite_rewards=finite_rewards)
    if agents is not None:
        raise EmulationError(f"agents={agents!r} applies to a gymnasium.Env; a PettingZoo env names its agents itself")
    try:
        from pettingzoo.utils.env import AECEnv, ParallelEnv
    except ImportError:  # the [pettingzoo] extra is not installed: no env here is a PettingZoo env
        AECEnv = ParallelEnv = ()
    if isinstance(env, ParallelEnv):
        return ParallelEmulation(env, **multi)
    if isinstance(env, AECEnv):
        return AECEmulation(env, **multi)
    raise EmulationError(
        f"emulate takes a gymnasium.Env, a PettingZoo ParallelEnv or AECEnv; got {type(env).__module__}.{type(env).__name__}")
