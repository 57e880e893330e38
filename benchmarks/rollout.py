"""Rollout step cost on CPU (issue 27): torch ops dispatched and microseconds per rollout step, packrl's collect
against a CleanRL-style rollout step, in one run.

- packrl: ``PPO.collect`` with the default policy (``Policy.from_env``, hidden 128) on Numba envs: the policy step
  (forward, sample, log-prob, value into storage), the env step and the env arrays into storage, and the
  per-rollout work after the loop (bootstrap values, checks, episode counts), per step;
- cleanrl-style: ppo.py's rollout step on the same Numba envs with CleanRL's Agent (separate actor and critic,
  two Tanh layers of 64 each): ``get_action_and_value`` under no_grad, the storage writes, ``.cpu().numpy()`` of
  the action, ``env.step``, ``torch.tensor`` of the next observation and dones, as ppo.py does them.

Torch ops are counted with a ``TorchDispatchMode`` (each is a kernel launch on a GPU: a device-independent measure
of the host overhead that leaves a GPU idle); microseconds are the median of ``--repeats`` rollouts of 128 steps,
one torch thread.

    python benchmarks/rollout.py [--repeats 7] [--envs 8,64]
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line
from train import Agent

from packrl import vector
from packrl.models import Policy
from packrl.train.ppo import PPO, PPOConfig

STEPS = 128


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def packrl_rollout(env_id: str, num_envs: int):
    env = vector.make(env_id, num_envs, backend="numba", seed=0)
    torch.manual_seed(0)
    ppo = PPO(env, Policy.from_env(env, hidden=128), PPOConfig(num_steps=STEPS, device="cpu"))
    ppo.collect()
    return ppo.collect, env


def cleanrl_rollout(env_id: str, num_envs: int):
    """ppo.py's rollout loop over a packrl Numba vector env (a flat Box observation: CartPole)."""
    env = vector.make(env_id, num_envs, backend="numba", seed=0)
    obs_dim, n = int(np.prod(env.single_observation_space.shape)), int(env.single_action_space.n)
    torch.manual_seed(0)
    agent = Agent(obs_dim, n)
    obs = torch.zeros((STEPS, num_envs, obs_dim))
    actions, logprobs, rewards, dones, values = (torch.zeros((STEPS, num_envs)) for _ in range(5))
    next_obs, _ = env.reset(seed=0)
    state = {"obs": torch.Tensor(next_obs), "done": torch.zeros(num_envs)}

    def rollout():
        next_obs, next_done = state["obs"], state["done"]
        for step in range(STEPS):
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            o, reward, terminations, truncations, _ = env.step(action.cpu().numpy())
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(o), torch.Tensor(np.logical_or(terminations, truncations))
        state["obs"], state["done"] = next_obs, next_done

    rollout()
    return rollout, env


def measure(make, env_id: str, num_envs: int, repeats: int) -> tuple[float, float]:
    """(torch ops per step, median µs per step)."""
    rollout, env = make(env_id, num_envs)
    counter = CountOps()
    with counter:
        rollout()
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        rollout()
        times.append(time.perf_counter() - tic)
    env.close()
    return counter.count / STEPS, statistics.median(times) / STEPS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--envs", default="8,64", help="comma list of env counts")
    args = parser.parse_args()
    try:
        env_counts = [int(n) for n in args.envs.split(",")]
    except ValueError:
        parser.error(f"--envs: a comma list of env counts, not {args.envs!r}")
    torch.set_num_threads(1)
    print(machine_line())
    print(f"rollout step cost, {STEPS}-step rollouts, median of {args.repeats}, 1 torch thread")
    print(f"{'contender':50} {'envs':>5} {'ops/step':>9} {'us/step':>9} {'vs cleanrl':>11}")
    rows = collections.defaultdict(dict)
    for n in env_counts:
        cleanrl = measure(cleanrl_rollout, "cartpole", n, args.repeats)
        for name, make, env_id in (("cleanrl-style (Agent, Numba cartpole)", cleanrl_rollout, "cartpole"),
                                   ("packrl collect (default policy, Numba cartpole)", packrl_rollout, "cartpole"),
                                   ("packrl collect (default policy, Numba gridworld)", packrl_rollout, "gridworld")):
            ops, us = cleanrl if make is cleanrl_rollout else measure(make, env_id, n, args.repeats)
            rows[n][name] = (ops, us)
            print(f"{name:50} {n:>5} {ops:>9.1f} {us:>9.1f} {cleanrl[1] / us:>10.2f}x")
    print("goal (issue 27): <= 40 torch ops per step for the default policy on the Numba gridworld "
          "(tests/test_ops_per_step.py)")


if __name__ == "__main__":
    main()
