"""Training throughput on CPU: packrl PPO against a CleanRL-style single-file PPO and SB3 PPO.

Agent steps per second of whole training (rollout + update) on CartPole. Every row of a group uses the
same PPO hyperparameters: num_envs, 128 steps, 4 epochs x 4 minibatches, Adam 2.5e-4, 64 hidden units (the
learning rate annealed to 0 in the CleanRL-style and packrl rows, as ppo.py and PPOConfig do; constant in SB3's).

- cleanrl-style: gymnasium SyncVectorEnv + CleanRL's Agent (separate actor and critic, two Tanh layers
  of 64 each), CleanRL's ppo.py loop (``cleanrl_ppo``, its arguments in ``CleanRLArgs``; benchmarks/learning.py
  runs the same loop to a return threshold);
- sb3: stable-baselines3 PPO("MlpPolicy", net_arch [64, 64]) on its DummyVecEnv;
- packrl ..., cleanrl net: packrl PPO with CleanRL's Agent network inside a packrl Policy (the raw
  observation, no scaling, into the same actor and critic with the same init): the same network;
- packrl ..., default policy: packrl's own Policy.from_env (Layout encoder + one MLP layer, shared by
  the actor and critic heads: about half the multiply-adds of CleanRL's two networks);
- gymnasium: packrl.vector.make(serial) over gymnasium CartPole-v1; numba: packrl's batched Numba CartPole.

    python benchmarks/train.py [--steps 32768] [--repeats 3] [--large-envs 64] [--device cpu]

``--device cuda`` puts every contender's network on the GPU (CleanRL's ``--cuda``, SB3's ``device``, packrl's
``PPOConfig.device``); the envs stay on the CPU (benchmarks/gpu_session.sh runs it on a GPU machine).

- ..., compile: ``PPOConfig(compile=True)`` (the rollout forward and the minibatch loss through torch.compile);
  its rate is measured after a first iteration, which compiles (seconds, more with a cold Inductor cache).

Groups: 8 envs (the issue's setting; SB3 only here) and --large-envs (CleanRL-style on a gymnasium
SyncVectorEnv of that many envs against packrl's Numba CartPole with as many envs).
Targets (issue 21): >= 2x cleanrl-style with the gymnasium env, >= 4x with the Numba env. After the tables, a
Targets table (benchmarks/targets.py) checks every packrl row against its group's CleanRL-style row (the median
repeat of each) and explains each miss with this run's numbers: both loops' rollout / update split per iteration
(the CleanRL loop's phases timed in ``cleanrl_ppo``), the ratio reachable with packrl's rollout or update free, and
an Amdahl bound from the env stepping alone with random actions, timed in the same repeats (``env_only_seconds``).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line
from targets import Split, Target, median_index, print_targets, rate_target

NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES, HIDDEN, LR = 8, 128, 4, 4, 64, 2.5e-4


# ---------------------------------------------------------------- CleanRL-style single-file PPO


@dataclass(frozen=True)
class CleanRLArgs:
    """CleanRL ppo.py's PPO arguments, with its defaults (it trains CartPole-v1 for 500k steps with them)."""

    num_envs: int = 4
    num_steps: int = 128
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    device: str = "cpu"  # ppo.py's --cuda: the agent and its buffers on this torch device


def _layer(i: int, o: int, std: float = np.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(i, o)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(_layer(obs_dim, HIDDEN), nn.Tanh(), _layer(HIDDEN, HIDDEN), nn.Tanh(), _layer(HIDDEN, 1, 1.0))
        self.actor = nn.Sequential(_layer(obs_dim, HIDDEN), nn.Tanh(), _layer(HIDDEN, HIDDEN), nn.Tanh(),
                                   _layer(HIDDEN, n_actions, 0.01))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        probs = torch.distributions.Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def sync_cartpoles(num_envs: int) -> gym.vector.SyncVectorEnv:
    """The CleanRL-style file's envs: ``num_envs`` CartPole-v1 in gymnasium's SyncVectorEnv. ppo.py was written for
    gymnasium 0.29, whose vector envs reset a finished env within the same step; 1.x defaults to resetting on the
    next step and ignoring that step's action, which its dones bookkeeping does not expect."""
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def cleanrl_update(agent: nn.Module, optimizer: torch.optim.Optimizer, args: Any, batch: tuple,
                   minibatch_size: int) -> None:
    """ppo.py's update: ``update_epochs`` passes of shuffled minibatches with the clipped policy and value losses.
    ``batch`` is ``(b_obs, b_logprobs, b_actions, b_advantages, b_returns, b_values)``; ``agent`` has
    ``get_action_and_value(obs, action)``. Shared by the discrete and the continuous CleanRL-style loops."""
    b_obs, b_logprobs, b_actions, b_advantages, b_returns, b_values = batch
    batch_size = len(b_logprobs)
    b_inds = np.arange(batch_size)
    for _ in range(args.update_epochs):
        np.random.shuffle(b_inds)
        for s in range(0, batch_size, minibatch_size):
            mb = b_inds[s:s + minibatch_size]
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
            ratio = (newlogprob - b_logprobs[mb]).exp()

            mb_advantages = b_advantages[mb]
            if args.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()

            newvalue = newvalue.view(-1)
            if args.clip_vloss:
                v_loss_unclipped = (newvalue - b_returns[mb]) ** 2
                v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -args.clip_coef, args.clip_coef)
                v_loss_clipped = (v_clipped - b_returns[mb]) ** 2
                v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
            else:
                v_loss = 0.5 * ((newvalue - b_returns[mb]) ** 2).mean()

            entropy_loss = entropy.mean()
            loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()


def cleanrl_ppo(total_steps: int, seed: int = 0, args: CleanRLArgs = CleanRLArgs(),
                callback: Callable[[int, list[float]], object] | None = None,
                phases: dict[str, float] | None = None) -> tuple[Agent, int, float]:
    """CleanRL's ppo.py on CartPole-v1, top to bottom. ``callback(global_step, returns)`` after each iteration's
    update, with the returns of the episodes that ended during its rollout. Returns the agent, the steps taken
    (whole iterations: total_steps // batch_size of them) and the loop's seconds (env construction and the
    first reset left out). ``phases``, when given, gets the seconds of the rollouts (``"rollout"``) and of the
    advantages and updates (``"update"``), as packrl's PPO reports its own."""
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = total_steps // batch_size
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    envs = sync_cartpoles(args.num_envs)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    device = torch.device(args.device)
    agent = Agent(obs_dim, n_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim)).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs)).to(device)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, args.num_envs)).to(device) for _ in range(4))

    global_step = 0
    next_obs = torch.Tensor(envs.reset(seed=seed)[0]).to(device)
    next_done = torch.zeros(args.num_envs).to(device)
    episode_return = np.zeros(args.num_envs)  # what RecordEpisodeStatistics sums in ppo.py
    start = time.perf_counter()
    spent = {"rollout": 0.0, "update": 0.0}
    for iteration in range(1, num_iterations + 1):
        tic = time.perf_counter()
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
            next_obs, reward, terminations, truncations, _ = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            episode_return += reward
            if next_done.any():
                finished.extend(episode_return[next_done].tolist())
                episode_return[next_done] = 0.0
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)

        toc = time.perf_counter()
        spent["rollout"] += toc - tic
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

        b_obs, b_logprobs, b_actions = obs.reshape(-1, obs_dim), logprobs.reshape(-1), actions.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)

        cleanrl_update(agent, optimizer, args, (b_obs, b_logprobs, b_actions.long(), b_advantages, b_returns, b_values),
                       minibatch_size)

        spent["update"] += time.perf_counter() - toc
        if callback is not None:
            callback(global_step, finished)
    elapsed = time.perf_counter() - start
    envs.close()
    if phases is not None:
        phases.update(spent)
    return agent, global_step, elapsed


def cleanrl_rate(total_steps: int, seed: int = 0, num_envs: int = NUM_ENVS, device: str = "cpu") -> Split:
    """``cleanrl_ppo`` with ppo.py's defaults at ``num_envs`` envs, this file's throughput setting (128 steps,
    4 x 4 minibatches, Adam 2.5e-4 annealed): its seconds, steps and the rollout / update split."""
    args = CleanRLArgs(num_envs=num_envs, device=device)
    phases: dict[str, float] = {}
    _, steps, seconds = cleanrl_ppo(total_steps, seed, args, phases=phases)
    iterations = steps // (num_envs * args.num_steps)
    return Split(seconds, steps, iterations, phases["rollout"], phases["update"],
                 iterations * args.update_epochs * args.num_minibatches)


def env_only_seconds(total_steps: int, backend: str, num_envs: int = NUM_ENVS, seed: int = 0) -> float:
    """Seconds that stepping ``num_envs`` CartPoles for ``total_steps`` agent steps takes with uniformly random
    actions (drawn beforehand) and nothing else: gymnasium's SyncVectorEnv as ``cleanrl_ppo`` builds it
    (``"sync"``), the ``gym.make`` envs' own ``step`` in a plain loop, a reset where an episode ends
    (``"gymnasium"``: what SyncVectorEnv and packrl's serial env both call), or packrl's Numba CartPole
    (``"numba"``). The env's share of a training loop, which no trainer around it can remove."""
    actions = np.random.default_rng(seed).integers(0, 2, (total_steps // num_envs, num_envs))
    if backend == "gymnasium":
        singles = [gym.make("CartPole-v1") for _ in range(num_envs)]
        for i, env in enumerate(singles):
            env.reset(seed=seed + i)
        start = time.perf_counter()
        for action in actions.tolist():
            for env, a in zip(singles, action):
                _, _, terminated, truncated, _ = env.step(a)
                if terminated or truncated:
                    env.reset()
        return time.perf_counter() - start
    if backend == "sync":
        envs = sync_cartpoles(num_envs)
        envs.reset(seed=seed)
    else:
        from packrl import vector

        envs = vector.make("cartpole", num_envs, backend="numba", seed=seed)
        envs.reset(seed)
    start = time.perf_counter()
    for action in actions:
        envs.step(action)
    elapsed = time.perf_counter() - start
    envs.close()
    return elapsed


# ---------------------------------------------------------------- SB3 and packrl


def sb3_ppo(total_steps: int, seed: int = 0, device: str = "cpu") -> Split:
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=NUM_ENVS, seed=seed)
    model = SB3PPO("MlpPolicy", env, n_steps=NUM_STEPS, batch_size=NUM_ENVS * NUM_STEPS // MINIBATCHES,
                   n_epochs=EPOCHS, learning_rate=LR, device=device, seed=seed,
                   policy_kwargs={"net_arch": [HIDDEN, HIDDEN]})
    start = time.perf_counter()
    model.learn(total_steps)
    return Split(time.perf_counter() - start, model.num_timesteps, model.num_timesteps // (NUM_ENVS * NUM_STEPS))


class _RawObservation(nn.Module):
    """The observation as CleanRL's Agent reads it: the float vector as it is, no scaling."""

    def __init__(self, size: int):
        super().__init__()
        self.output_size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).float()


class _CleanRLHeads(nn.Module):
    """CleanRL's Agent (separate actor and critic MLPs, same layers and init) as a packrl decoder."""

    def __init__(self, action_layout, obs_dim: int, n_actions: int):
        super().__init__()
        from packrl.models import ActionSpec

        agent = Agent(obs_dim, n_actions)
        self.actor, self.critic = agent.actor, agent.critic
        self.spec = ActionSpec(action_layout)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(hidden), self.critic(hidden).squeeze(-1)

    def distribution(self, logits: torch.Tensor):
        return self.spec.distribution(logits)

    def to_numpy(self, action: torch.Tensor):
        return self.spec.to_numpy(action)


def cleanrl_network_policy(env):
    """A packrl Policy whose network is exactly CleanRL's Agent: raw observation -> actor, critic."""
    from packrl.models import Policy
    from packrl.models.networks import MLP

    obs_dim = int(np.prod(env.single_observation_space.shape))
    return Policy(_RawObservation(obs_dim), MLP(obs_dim, layers=0),
                  _CleanRLHeads(env.emulated.action, obs_dim, int(env.single_action_space.n)))


def packrl_ppo(total_steps: int, backend: str, seed: int = 0, num_envs: int = NUM_ENVS, network: str = "cleanrl",
               compile: bool = False, device: str = "cpu") -> Split:
    """packrl PPO at this file's setting: its seconds, steps and the rollout / update split (PPO's own
    ``rollout_seconds`` and ``update_seconds``), the compiling first iteration left out."""
    from packrl import vector
    from packrl.models import Policy
    from packrl.train.ppo import PPO, PPOConfig

    creator = "cartpole" if backend == "numba" else (lambda: gym.make("CartPole-v1"))
    env = vector.make(creator, num_envs, backend=backend, seed=seed)
    torch.manual_seed(seed)
    policy = cleanrl_network_policy(env) if network == "cleanrl" else Policy.from_env(env, hidden=HIDDEN)
    ppo = PPO(env, policy, PPOConfig(num_steps=NUM_STEPS, update_epochs=EPOCHS, num_minibatches=MINIBATCHES,
                                     learning_rate=LR, seed=seed, device=device, compile=compile))
    warmup = 0
    if compile:  # the first iteration compiles (seconds): the rate is measured on the iterations after it
        ppo.train(num_envs * NUM_STEPS)
        warmup = ppo.global_step
    start = time.perf_counter()
    history = ppo.train(total_steps + warmup)
    seconds = time.perf_counter() - start
    env.close()
    return Split(seconds, ppo.global_step - warmup, len(history), sum(h["rollout_seconds"] for h in history),
                 sum(h["update_seconds"] for h in history), len(history) * EPOCHS * MINIBATCHES)


ANCHOR = "cleanrl-style (gymnasium)"
RATIOS = {"gymnasium": 2.0, "numba": 4.0}  # issue 21: packrl's steps/s over the CleanRL-style file's, by packrl's env
FLOORS = {"gymnasium": "the gymnasium CartPole-v1 envs' own step() in a loop", "sync": "gymnasium SyncVectorEnv stepping",
          "numba": "Numba CartPole stepping"}


def throughput_targets(results: dict[str, dict[str, list[Split]]], floors: dict[str, dict[str, list[float]]]
                       ) -> list[Target]:
    """Issue 21's throughput targets for every packrl row of every group (``results``: group -> contender -> runs),
    each against the CleanRL-style file of its group, the median repeat of each; ``floors``: group -> env kind ->
    seconds per agent step of that env stepping alone (median taken here)."""
    targets = []
    for g, rows in results.items():
        anchors = rows[ANCHOR]
        anchor = anchors[median_index([run.rate for run in anchors])]
        for name, runs in rows.items():
            kind = next((k for k in RATIOS if name.startswith(f"packrl {k}")), None)
            if kind is None:
                continue
            ours = runs[median_index([run.rate for run in runs])]
            env_floors = [(f"{FLOORS[k]} ({g}, random actions)", statistics.median(floors[g][k]))
                          for k in (("gymnasium", "sync") if kind == "gymnasium" else ("numba",)) if floors[g].get(k)]
            targets.append(rate_target(f"{name}, {g}", RATIOS[kind], "cleanrl-style", anchor, ours, env_floors))
    return targets


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=32768, help="agent steps per run (at least 4 iterations at large envs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every contender")
    parser.add_argument("--large-envs", type=int, default=64, help="num_envs of the second like-for-like group (0: skip)")
    parser.add_argument("--device", default="cpu", help="torch device of every contender's network (cpu, cuda)")
    args = parser.parse_args()
    if args.device != "cpu" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")
    dev = args.device
    torch.set_num_threads(args.threads)
    big = args.large_envs
    big_steps = max(args.steps, 4 * big * NUM_STEPS)
    groups: dict[str, dict] = {
        f"{NUM_ENVS} envs": {
            ANCHOR: lambda: cleanrl_rate(args.steps, device=dev),
            "sb3 PPO (gymnasium)": lambda: sb3_ppo(args.steps, device=dev),
            "packrl gymnasium, cleanrl net": lambda: packrl_ppo(args.steps, "serial", device=dev),
            "packrl numba, cleanrl net": lambda: packrl_ppo(args.steps, "numba", device=dev),
            "packrl gymnasium, default policy": lambda: packrl_ppo(args.steps, "serial", network="default", device=dev),
            "packrl numba, default policy": lambda: packrl_ppo(args.steps, "numba", network="default", device=dev),
            "packrl gymnasium, default, compile": lambda: packrl_ppo(args.steps, "serial", network="default", compile=True,
                                                                     device=dev),
            "packrl numba, default, compile": lambda: packrl_ppo(args.steps, "numba", network="default", compile=True,
                                                                 device=dev),
        },
    }
    if big:
        groups[f"{big} envs"] = {
            ANCHOR: lambda: cleanrl_rate(big_steps, num_envs=big, device=dev),
            "packrl numba, cleanrl net": lambda: packrl_ppo(big_steps, "numba", num_envs=big, device=dev),
            "packrl numba, default policy": lambda: packrl_ppo(big_steps, "numba", num_envs=big, network="default",
                                                               device=dev),
        }
    envs = {f"{NUM_ENVS} envs": (NUM_ENVS, args.steps), f"{big} envs": (big, big_steps)}
    packrl_ppo(NUM_ENVS * NUM_STEPS, "numba", device=dev)  # warm-up: Numba compilation, imports (and CUDA's start)
    results = {g: {name: [] for name in runs} for g, runs in groups.items()}
    floors = {g: {backend: [] for backend in FLOORS} for g in groups}  # seconds per agent step of the env alone
    for _ in range(args.repeats):  # interleaved, so load changes hit every contender alike
        for g, runs in groups.items():
            for name, run in runs.items():
                results[g][name].append(run())
            num_envs, steps = envs[g]
            for backend in FLOORS:
                floors[g][backend].append(env_only_seconds(steps, backend, num_envs) / (steps // num_envs * num_envs))
    print(f"CartPole PPO training throughput, {args.repeats} repeats, {NUM_STEPS} steps per env per iteration, "
          f"{EPOCHS}x{MINIBATCHES} minibatches, {HIDDEN} hidden, torch threads {args.threads}, device {dev}"
          + (f" ({torch.cuda.get_device_name()})" if dev != "cpu" else ""))
    print(machine_line(("stable_baselines3",)))
    for g, rows in results.items():
        steps = args.steps if g.startswith(f"{NUM_ENVS} ") else big_steps
        base = statistics.median(run.rate for run in rows[ANCHOR])
        print(f"\n{g} ({steps} agent steps a run)")
        print(f"{'contender':34} {'median steps/s':>15} {'min':>9} {'max':>9} {'vs cleanrl':>11}")
        for name, runs in rows.items():
            rates = [run.rate for run in runs]
            med = statistics.median(rates)
            print(f"{name:34} {med:15,.0f} {min(rates):9,.0f} {max(rates):9,.0f} {med / base:10.2f}x")
    print("\nevery row of a group has that group's num_envs and the same PPO hyperparameters; 'cleanrl net' rows "
          "run CleanRL's exact network inside packrl")
    print("targets (issue 21): packrl gymnasium >= 2x, packrl numba >= 4x (numbers depend on the machine's load)\n")
    print_targets(throughput_targets(results, floors))


if __name__ == "__main__":
    main()
