"""Replay buffers side by side on the same data: bytes per stored step and samples/s, packrl's ReplayBuffer
against stable-baselines3's ReplayBuffer (plain, memory-optimized, n-step) and DictReplayBuffer.

Data: (a) the NetHack-like Dict observation (ten leaves, 10,912 bytes packed; benchmarks/common.py), 8 envs,
8,000 transitions, episodes ending with probability 1/100 per step (half terminated, half truncated);
(b) packrl's Numba CartPole (float32 (4,), random actions, real terminations and 500-step truncations),
8 envs, 100,000 transitions; (c) packrl alone, 8,000 to 800,000 slots, episode ends at 1% or 50% of steps.
Each buffer is filled with the same stream until it has wrapped, then timed
sampling a batch onto CPU torch tensors (SB3: ``buffer.sample(B)``; packrl: ``sample(B, n, device="cpu")``,
observations nativized to the space's leaves). Bytes per stored step: every array the buffer allocates,
divided by the env steps it holds (packrl also stores one final observation per ended episode, counted).

    flock /tmp/cpu.lock .venv/bin/python benchmarks/replay.py
"""
from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import NETHACK, calls_per_batch, machine_line, print_table

from packrl import envs
from packrl.emulation import Layout
from packrl.train.replay import ReplayBuffer

NUM_ENVS, GAMMA = 8, 0.99
BATCHES = (32, 256)


def nethack_stream(steps: int, seed: int = 0) -> dict:
    """Dict observations drawn from a pool of 256 samples (space.sample of 10 KB is slow; the bytes are what
    matters), with random episode ends."""
    rng = np.random.default_rng(seed)
    NETHACK.seed(seed)
    pool = [NETHACK.sample() for _ in range(256)]
    layout = Layout.from_space(NETHACK)
    rows = np.stack([layout.pack(s) for s in pool])
    ids = rng.integers(0, 256, (steps + 1, NUM_ENVS))
    finals = rng.integers(0, 256, (steps, NUM_ENVS))
    ends = rng.random((steps, NUM_ENVS)) < 0.01
    terms = ends & (rng.random((steps, NUM_ENVS)) < 0.5)
    return {"layout": layout, "rows": rows, "leaves": {k: np.stack([s[k] for s in pool]) for k in NETHACK.spaces},
            "ids": ids, "finals": finals, "terms": terms, "truncs": ends & ~terms,
            "actions": rng.integers(0, 8, (steps, NUM_ENVS)), "rewards": rng.normal(size=(steps, NUM_ENVS)).astype(np.float32)}


def cartpole_stream(steps: int, seed: int = 0) -> dict:
    env = envs.make("cartpole", num_envs=NUM_ENVS, seed=seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = {k: [] for k in ("obs", "next", "final", "actions", "rewards", "terms", "truncs")}
    for _ in range(steps):
        actions = rng.integers(0, 2, NUM_ENVS)
        out["obs"].append(obs.copy())
        obs, rewards, terms, truncs, _ = env.step(actions)
        out["next"].append(obs.copy())
        out["final"].append(env.final_observations.copy())
        out["actions"].append(actions)
        out["rewards"].append(rewards.copy())
        out["terms"].append(terms.copy())
        out["truncs"].append(truncs.copy())
    return {k: np.stack(v) for k, v in out.items()}


def sb3_bytes(buffer) -> int:
    arrays = [buffer.actions, buffer.rewards, buffer.dones, buffer.timeouts]
    for name in ("observations", "next_observations"):
        value = getattr(buffer, name, None)
        if isinstance(value, dict):
            arrays += list(value.values())
        elif value is not None:
            arrays.append(value)
    return sum(a.nbytes for a in arrays)


def packrl_steps_held(buffer: ReplayBuffer) -> int:
    """Slots holding a step (not an episode's final observation)."""
    return int(buffer.count.sum() - np.count_nonzero(buffer.last))  # slots never written are not last


def interleaved_us(fns: dict, repeats: int = 9, min_time: float = 0.05) -> dict:
    """Median µs per call of each function, timed in rounds that visit every function in turn, so a change
    of machine load during the run falls on all of them alike."""
    counts = {name: calls_per_batch(fn, min_time) for name, fn in fns.items()}
    samples: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(counts[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / counts[name] * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def speed_rows(fns: dict, batch: int, anchors: dict) -> list:
    """Rows of (name, µs, samples/s, ratio to each anchor's samples/s); ``anchors`` maps a column to the
    name of the function it compares with."""
    us = interleaved_us(fns)
    return [[f"{name}, B={batch}", us[name], batch / us[name] * 1e6,
             *[us[anchor] / us[name] for anchor in anchors.values()]] for name in fns]


def dict_case() -> tuple[list, list]:
    from stable_baselines3.common.buffers import DictReplayBuffer

    capacity = 1_000  # per env: 8,000 transitions
    steps = capacity + 200  # wrapped
    data = nethack_stream(steps)
    ours = ReplayBuffer(capacity, NUM_ENVS, layout=data["layout"], gamma=GAMMA, seed=0)
    ours_per = ReplayBuffer(capacity, NUM_ENVS, layout=data["layout"], gamma=GAMMA, seed=0, prioritized=True)
    sb3 = DictReplayBuffer(capacity * NUM_ENVS, NETHACK, spaces.Discrete(8), device="cpu", n_envs=NUM_ENVS)
    for t in range(steps):
        obs_rows = data["rows"][data["ids"][t]]
        finals = np.where((data["terms"][t] | data["truncs"][t])[:, None], data["rows"][data["finals"][t]],
                          data["rows"][data["ids"][t + 1]])
        for buf in (ours, ours_per):
            buf.add(obs_rows, data["actions"][t], data["rewards"][t], data["terms"][t], data["truncs"][t], finals)
        ended = data["terms"][t] | data["truncs"][t]
        next_ids = np.where(ended, data["finals"][t], data["ids"][t + 1])
        sb3.add({k: v[data["ids"][t]] for k, v in data["leaves"].items()},
                {k: v[next_ids] for k, v in data["leaves"].items()}, data["actions"][t][:, None], data["rewards"][t],
                ended, [{"TimeLimit.truncated": bool(x)} for x in data["truncs"][t]])
    sb3_per_step = sb3_bytes(sb3) / (capacity * NUM_ENVS)
    ours_per_step, per_per_step = ours.nbytes / packrl_steps_held(ours), ours_per.nbytes / packrl_steps_held(ours_per)
    memory = [["SB3 DictReplayBuffer", sb3_per_step, 1.0],
              ["packrl ReplayBuffer", ours_per_step, ours_per_step / sb3_per_step],
              ["packrl ReplayBuffer, prioritized", per_per_step, per_per_step / sb3_per_step]]
    speed = []
    for batch in BATCHES:
        speed += speed_rows({"SB3 DictReplayBuffer": lambda: sb3.sample(batch),
                             "packrl, 1-step": lambda: ours.sample(batch, 1, device="cpu"),
                             "packrl, 3-step": lambda: ours.sample(batch, 3, device="cpu"),
                             "packrl, prioritized 3-step": lambda: ours_per.sample(batch, 3, device="cpu")},
                            batch, {"x SB3": "SB3 DictReplayBuffer"})
    return memory, speed


def cartpole_case() -> tuple[list, list]:
    from stable_baselines3.common.buffers import NStepReplayBuffer
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    capacity = 12_500  # per env: 100,000 transitions
    steps = capacity + 500
    data = cartpole_stream(steps)
    obs_space, act_space = spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2)
    size = capacity * NUM_ENVS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SB3 warns about the memory it will take
        sb3 = {"SB3 ReplayBuffer": SB3ReplayBuffer(size, obs_space, act_space, n_envs=NUM_ENVS),
               "SB3 ReplayBuffer, optimize_memory_usage (no timeouts)": SB3ReplayBuffer(
                   size, obs_space, act_space, n_envs=NUM_ENVS, optimize_memory_usage=True, handle_timeout_termination=False),
               "SB3 NStepReplayBuffer, n=3": NStepReplayBuffer(size, obs_space, act_space, n_envs=NUM_ENVS, n_steps=3, gamma=GAMMA)}
    ours = ReplayBuffer(capacity, NUM_ENVS, (4,), np.float32, gamma=GAMMA, seed=0)
    ours_per = ReplayBuffer(capacity, NUM_ENVS, (4,), np.float32, gamma=GAMMA, seed=0, prioritized=True)
    for t in range(steps):
        for buf in (ours, ours_per):
            buf.add(data["obs"][t], data["actions"][t], data["rewards"][t], data["terms"][t], data["truncs"][t], data["final"][t])
        ended = data["terms"][t] | data["truncs"][t]
        next_obs = np.where(ended[:, None], data["final"][t], data["next"][t])
        infos = [{"TimeLimit.truncated": bool(x)} for x in data["truncs"][t]]
        for buf in sb3.values():
            buf.add(data["obs"][t], next_obs, data["actions"][t][:, None], data["rewards"][t], ended, infos)
    base_bytes = sb3_bytes(sb3["SB3 ReplayBuffer"]) / size
    memory = [[name, sb3_bytes(buf) / size, sb3_bytes(buf) / size / base_bytes] for name, buf in sb3.items()]
    for name, buf in (("packrl ReplayBuffer", ours), ("packrl ReplayBuffer, prioritized", ours_per)):
        per_step = buf.nbytes / packrl_steps_held(buf)
        memory.append([name, per_step, per_step / base_bytes])
    speed = []
    for batch in BATCHES:
        speed += speed_rows({"SB3 ReplayBuffer": lambda: sb3["SB3 ReplayBuffer"].sample(batch),
                             "SB3 NStepReplayBuffer n=3": lambda: sb3["SB3 NStepReplayBuffer, n=3"].sample(batch),
                             "packrl, 1-step": lambda: ours.sample(batch, 1, device="cpu"),
                             "packrl, 3-step": lambda: ours.sample(batch, 3, device="cpu"),
                             "packrl, prioritized 3-step": lambda: ours_per.sample(batch, 3, device="cpu")},
                            batch, {"x SB3 1-step": "SB3 ReplayBuffer", "x SB3 3-step": "SB3 NStepReplayBuffer n=3"})
    return memory, speed


def scaling_case() -> list:
    """µs per uniform 3-step sample of 256 as the buffer grows and as episodes end more often: the index pass
    is per sample, so only the memory hierarchy (random rows of a larger buffer miss the caches more) and
    the shorter n-step walks near ends should show."""
    rows_out = []
    for slots in (8_000, 80_000, 800_000):
        for p_end in (0.01, 0.5):
            rng = np.random.default_rng(0)
            buf = ReplayBuffer(slots // NUM_ENVS, NUM_ENVS, (4,), np.float32, gamma=GAMMA, seed=0)
            obs = rng.normal(size=(64, NUM_ENVS, 4)).astype(np.float32)
            actions, rewards = np.zeros(NUM_ENVS, np.int64), np.ones(NUM_ENVS, np.float32)
            ends = rng.random((64, NUM_ENVS)) < p_end
            while buf.count.min() < buf.capacity:
                for t in range(64):
                    buf.add(obs[t], actions, rewards, ends[t], np.zeros(NUM_ENVS, bool), obs[t])
            us = interleaved_us({"sample": lambda: buf.sample(256, 3, device="cpu")}, repeats=5)["sample"]
            rows_out.append([f"{slots:,} slots, episode end p={p_end}", buf.transitions, us])
    return rows_out


def main() -> None:
    torch.set_num_threads(1)
    print(machine_line(("stable_baselines3",)))
    for title, case, ratios in (("(a) NetHack-like Dict, 10,912 B", dict_case, ["x SB3 (1-step)"]),
                                ("(b) CartPole, float32 (4,)", cartpole_case, ["x SB3 1-step", "x SB3 n-step (n=3)"])):
        memory, speed = case()
        print_table(f"{title}: bytes per stored step", ["buffer", "bytes/step", "x SB3"], memory)
        print_table(f"{title}: sampling onto CPU torch tensors (median of 9 interleaved rounds)",
                    ["buffer, batch", "µs/sample call", "samples/s", *ratios], speed)
    print_table("(c) packrl uniform 3-step sample of 256 as the buffer grows and episodes end more often",
                ["buffer", "transitions held", "µs/sample call"], scaling_case())


if __name__ == "__main__":
    main()
