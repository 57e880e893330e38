"""DQN on a Dict observation through packrl's replay buffer: n-step targets that stop at episode ends
(bootstrapping from the final observation on truncation, from nothing on termination), double-Q, optional
prioritized replay, and samples that arrive nativized on the learner's device.

The env is packrl's Numba gridworld (``packrl.envs.gridworld``): a Dict of an image, a position and a
direction, a MultiDiscrete([4, 2]) action that this example treats as 8 joint actions, goal terminations and
24-step truncations. A random policy scores about RANDOM_RETURN = 0.09; a policy scoring LEARNED_THRESHOLD =
0.8 walks to the goal.

    python examples/dqn_structured.py [--total-steps 15000] [--seed 0] [--prioritized] [--device cpu]

Measured on the project's 2-core machine (greedy return of 64 evaluation episodes every 2,500 env steps):
for seeds 0, 1, 2, uniform and prioritized, 0.24-0.43 at 2,500 steps, 1.26-1.28 at 5,000 (threshold 0.8
passed; the shortest-path policy scores about 1.30), 1.25-1.26 at 15,000; a 15,000-step run takes 5-6 s
uniform, 10-18 s prioritized, on one torch thread. The exit status is 0 when the final score passes 0.8.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from packrl import envs
from packrl.envs.gridworld import LEARNED_THRESHOLD, RANDOM_RETURN
from packrl.nativize import nativize
from packrl.train.replay import ReplayBuffer

NVEC = (4, 2)  # heading, move: a joint action a is (a // 2, a % 2)
NUM_ACTIONS = NVEC[0] * NVEC[1]


@dataclass
class Config:
    total_steps: int = 15_000  # env steps, all envs together
    num_envs: int = 8
    seed: int = 0
    gamma: float = 0.95
    n_step: int = 3
    buffer_capacity: int = 4096  # slots per env
    batch_size: int = 128
    learning_rate: float = 1e-3
    learning_starts: int = 1_000  # env steps before the first update
    target_every: int = 250  # updates between target network copies
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_fraction: float = 0.4  # share of the run over which epsilon falls
    hidden: int = 128
    prioritized: bool = False
    beta_start: float = 0.4  # importance-weight exponent, annealed to 1 (prioritized only)
    eval_every: int = 2_500
    eval_episodes: int = 64
    device: str = "cpu"


class QNetwork(nn.Module):
    """Q(s, .) from the gridworld's nativized leaves: each read in its own dtype, scaled, concatenated."""

    def __init__(self, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(5 * 5 * 2 + 2 + 4, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, NUM_ACTIONS))

    def forward(self, obs: dict) -> torch.Tensor:
        image = obs["image"].flatten(1).float() / 255.0  # uint8 (B, 5, 5, 2)
        position = obs["position"].float() / 4.0  # int64 (B, 2)
        direction = F.one_hot(obs["direction"].long(), 4).float()  # int64 (B,)
        return self.mlp(torch.cat([image, position, direction], dim=1))


def joint(actions: torch.Tensor) -> torch.Tensor:
    """MultiDiscrete (heading, move) pairs -> joint action index."""
    return actions[:, 0] * NVEC[1] + actions[:, 1]


def split(joint_actions: np.ndarray) -> np.ndarray:
    return np.stack([joint_actions // NVEC[1], joint_actions % NVEC[1]], axis=1).astype(np.int64)


def act(qnet: QNetwork, rows: np.ndarray, layout, epsilon: float, rng: np.random.Generator, device: str) -> np.ndarray:
    """Epsilon-greedy joint actions for a batch of packed observation rows."""
    with torch.no_grad():
        greedy = qnet(nativize(torch.from_numpy(rows).to(device), layout)).argmax(1).cpu().numpy()
    explore = rng.random(len(rows)) < epsilon
    return np.where(explore, rng.integers(0, NUM_ACTIONS, len(rows)), greedy)


def evaluate(qnet: QNetwork, episodes: int, seed: int, device: str) -> float:
    """Mean return of the greedy policy over the first ``episodes`` episodes of 64 fresh envs."""
    env = envs.make("gridworld", num_envs=64, seed=seed)
    obs, _ = env.reset(seed=seed)
    returns: list[float] = []
    rng = np.random.default_rng(seed)
    while len(returns) < episodes:
        obs, _, terms, truncs, _ = env.step(split(act(qnet, obs, env.emulated.observation, 0.0, rng, device)))
        returns.extend(env.episode_returns[terms | truncs].tolist())
    return float(np.mean(returns[:episodes]))


def train(config: Config, log=print) -> dict:
    """Train; returns the evaluation history [(env steps, greedy mean return)] and the final score."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    device = config.device
    env = envs.make("gridworld", num_envs=config.num_envs, seed=config.seed)
    layout = env.emulated.observation
    buffer = ReplayBuffer.for_env(env, config.buffer_capacity, gamma=config.gamma, seed=config.seed,
                                  prioritized=config.prioritized)
    qnet, target = QNetwork(config.hidden).to(device), QNetwork(config.hidden).to(device)
    target.load_state_dict(qnet.state_dict())
    optimizer = torch.optim.Adam(qnet.parameters(), lr=config.learning_rate)

    obs, _ = env.reset(seed=config.seed)
    history, updates, start = [], 0, time.perf_counter()
    iterations = config.total_steps // config.num_envs
    for iteration in range(1, iterations + 1):
        steps = iteration * config.num_envs
        fraction = min(1.0, steps / (config.epsilon_fraction * config.total_steps))
        epsilon = config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)
        actions = split(act(qnet, obs, layout, epsilon, rng, device))
        taken_at = obs.copy()  # the env writes the next observations into the same array
        obs, rewards, terms, truncs, _ = env.step(actions)
        buffer.add(taken_at, actions, rewards, terms, truncs, env.final_observations)

        if steps >= config.learning_starts:
            beta = config.beta_start + (1.0 - config.beta_start) * steps / config.total_steps
            batch = buffer.sample(config.batch_size, config.n_step, device=device, beta=beta)
            q = qnet(batch.observations).gather(1, joint(batch.actions)[:, None]).squeeze(1)
            with torch.no_grad():  # double DQN: the online net picks, the target net values
                best = qnet(batch.next_observations).argmax(1, keepdim=True)
                bootstrap = target(batch.next_observations).gather(1, best).squeeze(1)
                targets = batch.returns + batch.discounts * bootstrap  # discounts: 0 after a termination
            td = targets - q
            loss = (batch.weights * F.smooth_l1_loss(q, targets, reduction="none")).mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(qnet.parameters(), 10.0)
            optimizer.step()
            if config.prioritized:
                buffer.update_priorities(batch, td.abs())
            updates += 1
            if updates % config.target_every == 0:
                target.load_state_dict(qnet.state_dict())

        if steps % config.eval_every < config.num_envs or iteration == iterations:
            score = evaluate(qnet, config.eval_episodes, seed=10_000 + config.seed, device=device)
            history.append((steps, score))
            log(f"steps {steps:>7,}  greedy return {score:5.2f}  epsilon {epsilon:4.2f}  "
                f"buffer {buffer.transitions:>6,} transitions  {time.perf_counter() - start:5.1f} s")
    reached = next((s for s, score in history if score >= LEARNED_THRESHOLD), None)
    return {"history": history, "final": history[-1][1], "reached_threshold_at": reached,
            "seconds": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-steps", type=int, default=Config.total_steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prioritized", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = Config(total_steps=args.total_steps, seed=args.seed, prioritized=args.prioritized, device=args.device)
    print(f"gridworld: a random policy scores about {RANDOM_RETURN}, a learned one {LEARNED_THRESHOLD} or more")
    result = train(config)
    print(f"final greedy return {result['final']:.2f}; threshold {LEARNED_THRESHOLD} first reached at "
          f"{result['reached_threshold_at']} env steps; {result['seconds']:.0f} s")
    return 0 if result["final"] >= LEARNED_THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
