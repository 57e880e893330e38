"""Per-sample pack + unpack, side by side: gymnasium flatten/unflatten, a structured-dtype writer
(the older byte-packing libraries' approach), packrl, and np.copyto of the same bytes (the floor).
Also the emulate wrapper's added cost per env.step (per action kind: Discrete, MultiDiscrete, Box,
hybrid Dict, a nested Dict/Tuple, and Pendulum-v1), and the bytes torch nativize copies. The packrl rows
use the compiled pack (the C extension); "Python path" is the same API on a layout made with the
extension hidden: the checked Python path alone, what a build without a C compiler has.

    .venv/bin/python benchmarks/emulation.py [--actions]   (--actions: the action-kind table alone)
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.spaces import utils as gym_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import NETHACK, calls_per_batch, machine_line, per_call_us, print_table

from packrl.emulation import Layout, compiled, emulate
from packrl.nativize import nativize

MINIGRID = spaces.Dict({
    "image": spaces.Box(0, 255, (7, 7, 3), np.uint8),
    "direction": spaces.Discrete(4),
})
ATARI = spaces.Dict({
    "frame": spaces.Box(0, 255, (84, 84, 4), np.uint8),
    "vector": spaces.Box(-np.inf, np.inf, (8,), np.float32),
})


# ---------------------------------------------------------------- the older approach

def structured_dtype(space: spaces.Space) -> np.dtype:
    """A numpy structured dtype mirroring a Dict space (how older byte-packing libraries lay rows out)."""
    fields = []
    for key, sub in space.spaces.items():
        if isinstance(sub, spaces.Dict):
            fields.append((key, structured_dtype(sub)))
        elif isinstance(sub, spaces.Discrete):
            fields.append((key, np.int32, ()))
        else:
            fields.append((key, sub.dtype, sub.shape))
    return np.dtype(fields)


def structured_write(view: np.ndarray, sample: dict) -> None:
    for key, value in sample.items():
        if isinstance(value, dict):
            structured_write(view[key], value)
        else:
            view[key] = value


def structured_read(view: np.ndarray) -> dict:
    return {k: structured_read(view[k]) if view.dtype[k].names else view[k] for k in view.dtype.names}


@contextlib.contextmanager
def without_c_extension():
    """Layouts made inside pack on the checked Python path alone, as without a C compiler."""
    saved, compiled._fastpack = compiled._fastpack, None
    try:
        yield
    finally:
        compiled._fastpack = saved


# ---------------------------------------------------------------- cases

def pack_unpack_rows(name: str, space: spaces.Space) -> list:
    space.seed(0)
    sample = space.sample()
    layout = Layout.from_space(space)
    row = np.zeros(layout.nbytes, np.uint8)
    bound = layout.bind(row)
    sdt = structured_dtype(space)
    sbuf = np.zeros(sdt.itemsize, np.uint8)
    sview = sbuf.view(sdt)[0:1].reshape(())
    src, dst = layout.pack(sample), np.zeros(layout.nbytes, np.uint8)

    def gym_round():
        return gym_utils.unflatten(space, gym_utils.flatten(space, sample))

    def struct_round():
        structured_write(sview, sample)
        return structured_read(sview)

    def packrl_round():
        layout.pack(sample, out=row)
        return layout.unpack(row)

    def packrl_bound():
        bound.pack(sample)
        return bound.tree

    with without_c_extension():
        python_layout = Layout.from_space(space)
    python_bound = python_layout.bind(np.zeros(layout.nbytes, np.uint8))

    def packrl_python():
        python_layout.pack(sample, out=row)
        return python_layout.unpack(row)

    def packrl_python_bound():
        python_bound.pack(sample)
        return python_bound.tree

    results = {
        "gymnasium flatten+unflatten": per_call_us(gym_round),
        "structured-dtype writer": per_call_us(struct_round),
        "packrl pack+unpack, Python path": per_call_us(packrl_python),
        "packrl pack+unpack": per_call_us(packrl_round),
        "packrl bound rows (emulate)": per_call_us(packrl_bound),
        "packrl bound rows, Python path": per_call_us(packrl_python_bound),
        "np.copyto floor": per_call_us(lambda: np.copyto(dst, src)),
    }
    gym_t = results["gymnasium flatten+unflatten"][0]
    struct_t = results["structured-dtype writer"][0]
    floor = results["np.copyto floor"][0]
    return [[f"{name} ({layout.nbytes} B)", method, med, spread, gym_t / med, med / struct_t, med / floor]
            for method, (med, spread) in results.items()]


class NetHackLike(gym.Env):
    """Returns a fixed NetHack-like observation: the env costs nearly nothing, so the wrapper's cost shows."""

    observation_space = NETHACK
    action_space = spaces.Discrete(8)

    def __init__(self):
        self.observation_space.seed(0)
        self.obs = self.observation_space.sample()

    def reset(self, seed=None, options=None):
        return self.obs, {}

    def step(self, action):
        return self.obs, 0.0, False, False, {}


def wrapper_rows() -> list:
    raw, env = NetHackLike(), emulate(NetHackLike())
    with without_c_extension():
        python_env = emulate(NetHackLike())
    for e in (raw, env, python_env):
        e.reset()
    assert env.emulated.observation.compiled_pack() is not None, "the C extension should be in use"
    action = np.array([3])
    raw_t = per_call_us(lambda: raw.step(3))
    wrapped_t = per_call_us(lambda: env.step(action))
    python_t = per_call_us(lambda: python_env.step(action))
    obs = raw.obs
    src = np.zeros(env.emulated.observation.nbytes, np.uint8)
    dst = np.zeros_like(src)

    def copy_floor_step():  # the bytes must be copied at least once: one np.copyto of all of them
        raw.step(3)
        np.copyto(dst, src)

    floor_t = per_call_us(copy_floor_step)
    assert obs is raw.obs
    return [["raw env.step", raw_t[0], raw_t[1], 0.0],
            ["raw step + one np.copyto of the 10,912 bytes", floor_t[0], floor_t[1], floor_t[0] - raw_t[0]],
            ["emulate(env).step (compiled pack, the default)", wrapped_t[0], wrapped_t[1], wrapped_t[0] - raw_t[0]],
            ["emulate(env).step, Python path (no C compiler)", python_t[0], python_t[1], python_t[0] - raw_t[0]]]


ACTION_KINDS = {  # the action space of each row, and the policy action the emulated env is stepped with
    "Discrete(8)": spaces.Discrete(8),
    "MultiDiscrete([3, 4, 5])": spaces.MultiDiscrete([3, 4, 5]),
    "Box(-1, 1, (2,), float32)": spaces.Box(-1, 1, (2,), np.float32),
    "Dict(Discrete(5), Box(2)) hybrid": spaces.Dict({"move": spaces.Discrete(5), "aim": spaces.Box(-1, 1, (2,), np.float32)}),
    "Dict(Tuple(MultiBinary(3), Discrete(4, start=-2)), Box float64 (3,))": spaces.Dict({
        "buttons": spaces.Tuple((spaces.MultiBinary(3), spaces.Discrete(4, start=-2))),
        "stick": spaces.Box(-2, 2, (3,), np.float64)}),
}


class ActionKind(NetHackLike):
    """NetHackLike with another action space (the step ignores the action)."""

    def __init__(self, action_space: spaces.Space):
        super().__init__()
        self.action_space = action_space


def policy_action(env) -> object:
    """One action in the emulated env's policy form (what a policy hands ``step``), as arrays."""
    env.single_action_space.seed(0)
    action = env.single_action_space.sample()
    if isinstance(action, (int, np.integer)):
        return np.array([action])
    return {k: np.asarray(v) for k, v in action.items()} if isinstance(action, dict) else np.asarray(action)


def action_kind_rows(rounds: int = 9) -> list:
    """What ``emulate(env).step`` adds per step for each action kind (NetHack-like observation), and
    the same on Pendulum-v1 (a Box action, a Box observation that passes through). Every call is
    timed in each of ``rounds`` rounds in turn, so load from other jobs falls on all alike; "over
    Discrete" is the median of the per-round differences (paired by round)."""
    calls = {}
    for name, space in ACTION_KINDS.items():
        raw, env = ActionKind(space), emulate(ActionKind(space))
        raw.reset()
        env.reset()
        space.seed(0)
        native, action = space.sample(), policy_action(env)
        calls[name] = (functools.partial(raw.step, native), functools.partial(env.step, action))
    raw, env = gym.make("Pendulum-v1"), emulate(gym.make("Pendulum-v1"))
    raw.reset(seed=0)
    env.reset(seed=0)
    calls["Pendulum-v1 (Box(-2, 2, (1,)) action)"] = (functools.partial(raw.step, np.array([0.5], np.float32)),
                                                       functools.partial(env.step, np.array([0.5], np.float32)))
    sizes = {fn: calls_per_batch(fn) for pair in calls.values() for fn in pair}
    times: dict = {fn: [] for fn in sizes}
    for _ in range(rounds):
        for fn, n in sizes.items():
            start = time.perf_counter()
            for _ in range(n):
                fn()
            times[fn].append((time.perf_counter() - start) / n * 1e6)
    added = {name: [w - r for r, w in zip(times[raw_fn], times[env_fn])] for name, (raw_fn, env_fn) in calls.items()}
    rows = []
    for name, (raw_fn, env_fn) in calls.items():
        over = [a - d for a, d in zip(added[name], added["Discrete(8)"])] if name in ACTION_KINDS else [float("nan")]
        rows.append([name, statistics.median(times[raw_fn]), statistics.median(times[env_fn]),
                     max(times[env_fn]) - min(times[env_fn]), statistics.median(added[name]), statistics.median(over)])
    return rows


def decode_rows() -> list:
    """``ActionLayout.decode`` of one policy action per kind: the C decoder (what ``decode`` uses) and
    the checked Python path (what every action took before it, and what a build without a C
    compiler takes)."""
    from packrl.emulation.actions import ActionLayout

    rows = []
    for name, space in ACTION_KINDS.items():
        act = ActionLayout(space)
        space.seed(0)
        action = act.encode(space.sample())
        action = np.array([action]) if isinstance(action, (int, np.integer)) else action
        c_t = per_call_us(functools.partial(act.decode, action))
        py_t = per_call_us(functools.partial(act.checked_decode, action))
        rows.append([name, c_t[0], c_t[1], py_t[0], py_t[1], py_t[0] / c_t[0]])
    return rows


def nativize_copies() -> int:
    layout = Layout.from_space(NETHACK)
    NETHACK.seed(0)
    rows = torch.from_numpy(layout.pack_batch([NETHACK.sample() for _ in range(64)]))
    before = rows.untyped_storage().data_ptr()
    views = nativize(rows, layout)
    copied = sum(v.numel() * v.element_size() for v in views.values() if v.untyped_storage().data_ptr() != before)
    return copied


def main() -> None:
    print(machine_line())
    if "--actions" in sys.argv[1:]:  # the action-kind table alone
        print_table("emulate(env).step per action kind (µs, median of 9 interleaved rounds); target: each kind adds <= 2 µs over Discrete",
                    ["action space", "raw env.step", "emulate step", "spread", "added µs", "added - Discrete's"],
                    action_kind_rows())
        print_table("ActionLayout.decode of one action (µs, median of 7)",
                    ["action space", "C decoder", "spread", "Python path", "spread", "Python / C"], decode_rows())
        return
    rows = []
    for name, space in [("(a) MiniGrid-like", MINIGRID), ("(b) NetHack-like", NETHACK), ("(c) Atari-like", ATARI)]:
        rows += pack_unpack_rows(name, space)
    print_table("pack + unpack per sample (µs, median of 7)",
                ["case", "method", "median µs", "spread µs", "gymnasium / this", "this / structured", "this / copy floor"], rows)
    print_table("emulate wrapper cost per step on (b) NetHack-like (µs, median of 7)",
                ["", "median µs", "spread µs", "added µs"], wrapper_rows())
    print_table("emulate(env).step per action kind (µs, median of 9 interleaved rounds); target: each kind adds <= 2 µs over Discrete",
                ["action space", "raw env.step", "emulate step", "spread", "added µs", "added - Discrete's"],
                action_kind_rows())
    print(f"torch nativize of 64 NetHack-like rows copied {nativize_copies()} bytes")


if __name__ == "__main__":
    main()
