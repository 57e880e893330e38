"""Wrap a real structured env (MiniGrid) and print every leaf recovered from the packed row.

    .venv/bin/python examples/emulate_minigrid.py
"""
import gymnasium as gym
import minigrid  # noqa: F401  (registers the MiniGrid envs)
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from packrl.emulation import emulate
from packrl.nativize import nativize


def main() -> None:
    env = emulate(gym.make("BabyAI-GoToLocal-v0"))
    raw = gym.make("BabyAI-GoToLocal-v0")
    rows, _ = env.reset(seed=1)
    raw_obs, _ = raw.reset(seed=1)
    layout = env.emulated.observation
    console = Console()
    console.print(layout)
    console.print(f"one observation = {rows.shape[1]} bytes of {rows.dtype}")

    table = Table(title="leaves recovered from the packed row (numpy views, then torch views)")
    for col in ("leaf", "dtype", "shape", "equals the raw env", "torch dtype"):
        table.add_column(col)
    native = layout.to_native(layout.unpack(rows[0]))
    tensors = nativize(torch.from_numpy(rows), layout)
    for key in raw_obs:
        value, tensor = native[key], tensors[key]
        same = value == raw_obs[key] if isinstance(value, str) else np.array_equal(value, raw_obs[key])
        tdtype = str(tensor.chars.dtype) + " + length" if isinstance(tensor, tuple) else str(tensor.dtype)
        shown = repr(value) if isinstance(value, str) else str(np.asarray(value).dtype)
        table.add_row(key, shown, str(np.shape(value)), str(same), tdtype)
    console.print(table)
    for _ in range(5):
        rows, rewards, terminals, truncations, _ = env.step(np.array([2]))
        raw_obs, *_ = raw.step(2)
        assert np.array_equal(layout.unpack(rows[0])["image"], raw_obs["image"])
    console.print("5 steps later every image leaf still equals the raw env's: ok")


if __name__ == "__main__":
    main()
