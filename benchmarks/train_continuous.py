"""A CleanRL-style ``ppo_continuous_action.py`` in one function, for benchmarks/learning.py's continuous table.

CleanRL's loop and Agent as its file has them (the defaults of ``ContinuousArgs`` are its MuJoCo defaults): each
env is gymnasium's ``make(env_id)`` under FlattenObservation, RecordEpisodeStatistics (returns in the env's own
units), ClipAction, NormalizeObservation, TransformObservation clip to +-10, NormalizeReward(gamma) and
TransformReward clip to +-10, in a SyncVectorEnv; the Agent is a tanh 64-64 critic and a tanh 64-64 actor mean
with a state-independent ``actor_logstd`` (zeros), orthogonal init (std sqrt(2), 1.0 for the value, 0.01 for the
mean). The sampled action is stored unclipped (its log-probability is the one trained); ClipAction clips what the
env receives.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from train import _layer, cleanrl_update


@dataclass(frozen=True)
class ContinuousArgs:
    """CleanRL ppo_continuous_action.py's PPO arguments, with its defaults (HalfCheetah, 1M steps)."""

    num_envs: int = 1
    num_steps: int = 2048
    learning_rate: float = 3e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 32
    update_epochs: int = 10
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5


class ContinuousAgent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.critic = nn.Sequential(_layer(obs_dim, 64), nn.Tanh(), _layer(64, 64), nn.Tanh(), _layer(64, 1, 1.0))
        self.actor_mean = nn.Sequential(_layer(obs_dim, 64), nn.Tanh(), _layer(64, 64), nn.Tanh(),
                                        _layer(64, act_dim, 0.01))
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        action_mean = self.actor_mean(x)
        action_std = self.actor_logstd.expand_as(action_mean).exp()
        probs = torch.distributions.Normal(action_mean, action_std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def make_env(env_id: str, gamma: float) -> Callable[[], gym.Env]:
    def thunk() -> gym.Env:
        env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


def _obs_stats(envs: gym.vector.SyncVectorEnv) -> tuple[np.ndarray, np.ndarray]:
    """The first env's NormalizeObservation mean and variance (CleanRL keeps one per env; env 0's plays the eval)."""
    env = envs.envs[0]
    while not isinstance(env, gym.wrappers.NormalizeObservation):
        env = env.env
    return env.obs_rms.mean.copy(), env.obs_rms.var.copy()


def cleanrl_ppo_continuous(env_id: str, total_steps: int, seed: int = 0, args: ContinuousArgs = ContinuousArgs(),
                           callback: Callable[[int, list[float]], object] | None = None):
    """ppo_continuous_action.py on ``env_id``, top to bottom. ``callback(global_step, returns)`` after each
    iteration's update, with the returns (env units) of the episodes that ended during its rollout. Returns the
    agent, the steps taken (whole iterations) and the observation statistics (mean, var) for a greedy eval."""
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = total_steps // batch_size
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    envs = gym.vector.SyncVectorEnv([make_env(env_id, args.gamma) for _ in range(args.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    agent = ContinuousAgent(obs_dim, act_dim)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim))
    actions = torch.zeros((args.num_steps, args.num_envs, act_dim))
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, args.num_envs)) for _ in range(4))

    global_step = 0
    next_obs = torch.Tensor(envs.reset(seed=seed)[0])
    next_done = torch.zeros(args.num_envs)
    for iteration in range(1, num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        finished: list[float] = []
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
            next_obs, reward, terminations, truncations, infos = envs.step(action.numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            final = infos.get("final_info", {})  # SAME_STEP autoreset: an ended env's info is under final_info
            if "episode" in final:  # RecordEpisodeStatistics; "_episode" marks the envs whose episode ended
                finished.extend(float(r) for r in final["episode"]["r"][final["_episode"]])
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                nextnonterminal = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs, b_logprobs, b_actions = obs.reshape(-1, obs_dim), logprobs.reshape(-1), actions.reshape(-1, act_dim)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)

        cleanrl_update(agent, optimizer, args, (b_obs, b_logprobs, b_actions, b_advantages, b_returns, b_values),
                       minibatch_size)
        if callback is not None:
            callback(global_step, finished)
    stats = _obs_stats(envs)
    envs.close()
    return agent, global_step, stats


def greedy_returns_continuous(agent: ContinuousAgent, env_id: str, obs_stats: tuple[np.ndarray, np.ndarray],
                              episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` episodes of a fresh ``env_id`` (reset with seed, seed + 1, ...), each action the
    actor's mean clipped to the action space, the observation normalized by the training statistics (frozen)."""
    mean, var = obs_stats
    env = gym.wrappers.FlattenObservation(gym.make(env_id))
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            x = np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10)
            with torch.no_grad():
                action = agent.actor_mean(torch.as_tensor(x, dtype=torch.float32)).numpy()
            obs, reward, terminated, truncated, _ = env.step(np.clip(action, low, high))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


if __name__ == "__main__":  # a smoke run: python benchmarks/train_continuous.py [ENV_ID] [STEPS]
    import sys

    torch.set_num_threads(1)
    env_id, steps = (sys.argv[1] if len(sys.argv) > 1 else "Pendulum-v1"), int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    tic = time.perf_counter()
    agent, taken, stats = cleanrl_ppo_continuous(env_id, steps, 0, callback=lambda s, r: r and print(s, np.mean(r)))
    greedy = np.mean(greedy_returns_continuous(agent, env_id, stats, 5, 10_000))
    print(f"{taken} steps in {time.perf_counter() - tic:.1f} s; greedy {greedy:.1f}")
