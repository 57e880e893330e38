"""CleanRL's single-file PPO (``ppo.py``), read top to bottom, on a packrl vector env whose observation is
structured: MiniGrid's Dict of an image (7, 7, 3) uint8, a Discrete direction and a Text mission.

Written after CleanRL's ppo.py: the same arguments, agent, storage, rollout, GAE and clipped update, in the
same order and under the same names. Every line that differs because of packrl's API carries a
``# packrl:`` comment. These are the places:

- the envs come from ``packrl.vector.make`` (rows of packed bytes, gymnasium's dict ``infos`` so that
  gymnasium's own ``RecordEpisodeStatistics`` wraps them as in CleanRL);
- observations are stored as the uint8 rows they are (``torch.as_tensor``, not ``torch.Tensor``, which
  would cast them to float32 and lose the bytes);
- the agent turns rows into leaves with ``nativize`` (zero-copy views, exact dtypes) and embeds the leaves
  it uses before its MLPs;
- arguments are read by ``argparse`` from the ``Args`` dataclass (CleanRL uses ``tyro``, which packrl does
  not depend on);
- ``--capture-video`` records env 0, which CleanRL's ``make_env`` is told by its index: packrl calls one
  creator per env without an index, so the video needs the serial backend, which makes env 0 first, here.

As in CleanRL, every figure goes to TensorBoard (``runs/<run_name>``) and, with ``--track``, to Weights &
Biases (``sync_tensorboard``; offline unless ``WANDB_MODE`` says otherwise or you are logged in and W&B
answers, as ``packrl train --track``: ``packrl.train.tracking.wandb_mode``). Two changes are not packrl's:
losses and episode returns are also printed, and an iteration whose losses are not finite stops the run.

    .venv/bin/python examples/cleanrl_ppo.py --total-timesteps 50000
    tensorboard --logdir runs
"""
import argparse
import dataclasses
import itertools
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import minigrid  # noqa: F401 - registers the MiniGrid ids
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

from packrl import vector  # packrl: the vector env
from packrl.nativize import nativize  # packrl: rows -> leaves inside the agent


@dataclass
class Args:
    exp_name: str = "cleanrl_ppo"
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=False`"""
    cuda: bool = True
    """if toggled, cuda will be enabled by default"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (check out `videos` folder)"""

    # Algorithm specific arguments
    env_id: str = "MiniGrid-Empty-5x5-v0"
    """the id of the environment"""
    backend: str = "serial"
    """packrl: the vector backend (serial, multiprocessing, ray)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def parse_args() -> Args:
    """packrl: argparse over the Args fields (CleanRL: ``tyro.cli(Args)``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=f.default)
        elif f.name in ("target_kl", "wandb_entity"):
            parser.add_argument(flag, type=float if f.name == "target_kl" else str, default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    args = Args(**vars(parser.parse_args()))
    if args.capture_video and args.backend != "serial":
        parser.error("--capture-video records env 0, which only the serial backend makes first, in this process")
    return args


def make_env(env_id, capture_video, run_name):
    made = itertools.count()  # packrl: one creator for every env; the serial backend calls it for env 0 first

    def thunk():
        idx = next(made)
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id)
        return env

    return thunk


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.layout = envs.unwrapped.emulated.observation  # packrl: where each leaf sits in a row
        image = self.layout.unpack(np.zeros(self.layout.nbytes, np.uint8))["image"]
        self.directions = 4
        obs_dim = int(np.prod(image.shape)) + self.directions  # packrl: the leaves the MLPs see
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def embed(self, x):
        """packrl: uint8 rows -> leaves (zero-copy views, exact dtypes) -> one float vector per row. The
        image holds small object/colour/state indices (scaled to about [0, 1]); the direction is one-hot."""
        leaves = nativize(x, self.layout)
        image = leaves["image"].flatten(1).float() / 10.0
        direction = nn.functional.one_hot(leaves["direction"].long(), self.directions).float()
        return torch.cat([image, direction], dim=1)

    def get_value(self, x):
        return self.critic(self.embed(x))  # packrl: embed

    def get_action_and_value(self, x, action=None):
        hidden = self.embed(x)  # packrl: embed
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


if __name__ == "__main__":
    args = parse_args()
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if args.track:
        import wandb

        from packrl.train.tracking import wandb_mode  # packrl: offline where W&B cannot be reached

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            monitor_gym=False,  # packrl: wandb's gym monitor reads RecordVideo.enabled, gone since gymnasium 1.0
            save_code=True,
            mode=wandb_mode(),
        )
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
    )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    # packrl: one vector env of packed rows; infos="dict" is gymnasium's form, which its wrappers need
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        vector.make(make_env(args.env_id, args.capture_video, run_name), args.num_envs, backend=args.backend,
                    seed=args.seed, infos="dict")
    )
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete action space is supported"

    agent = Agent(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup
    # packrl: observations are stored as the uint8 rows they are
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape, dtype=torch.uint8).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    start_time = time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs).to(device)  # packrl: as_tensor keeps uint8 (torch.Tensor would cast)
    next_done = torch.zeros(args.num_envs).to(device)

    for iteration in range(1, args.num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            # packrl: as_tensor keeps uint8 (on CPU it shares the vector env's rows, read before the next step)
            next_obs, next_done = torch.as_tensor(next_obs).to(device), torch.Tensor(next_done).to(device)

            if "episode" in infos:
                for i in np.flatnonzero(infos["_episode"]):
                    print(f"global_step={global_step}, episodic_return={infos['episode']['r'][i]:.3f}")
                    writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], global_step)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
        writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
        writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
        writer.add_scalar("losses/clipfrac", np.mean(clipfracs), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("charts/SPS", int(global_step / (time.time() - start_time)), global_step)

        print(
            f"iteration={iteration} global_step={global_step} value_loss={v_loss.item():.6f} "
            f"policy_loss={pg_loss.item():.6f} entropy={entropy_loss.item():.6f} "
            f"approx_kl={approx_kl.item():.6f} clipfrac={np.mean(clipfracs):.4f} explained_variance={explained_var:.4f} "
            f"SPS={int(global_step / (time.time() - start_time))}"
        )
        assert math.isfinite(v_loss.item()) and math.isfinite(pg_loss.item()), "a loss is not finite"

    envs.close()
    writer.close()
    if args.track and args.capture_video:  # packrl: what monitor_gym=True would have uploaded
        for video in sorted(Path(f"videos/{run_name}").glob("*.mp4")):
            wandb.log({"videos": wandb.Video(str(video))})
