"""Two-player zero-sum games: how often a policy wins, draws and loses against a uniformly random legal
opponent. In self-play the mean return of both seats is 0 by construction, so this is the figure that
says whether a policy for connect four or tic-tac-toe learned anything.

The policy plays every seat in turn (game g puts it in seat ``g % 2``); the opponent picks uniformly
among the legal actions of the observation's action mask. Games are seeded from ``seed``, and the policy's
sampling runs on a forked torch RNG, so a periodic check in training never changes the training run.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import torch

ZERO_SUM_GAMES = ("connect_four", "tictactoe", "chess", "go", "leduc_holdem", "texas_holdem", "texas_holdem_no_limit")
"""PettingZoo classic games (``pettingzoo.classic.<name>_vN``) with two players and zero-sum rewards."""


def is_two_player_zero_sum(env_id: str) -> bool:
    """True for ``pettingzoo.classic.<game>_vN`` ids of the games in ZERO_SUM_GAMES."""
    match = re.fullmatch(r"pettingzoo\.classic\.([a-z_]+?)_v\d+", env_id)
    return bool(match) and match.group(1) in ZERO_SUM_GAMES


@torch.no_grad()
def versus_random(policy: Any, env_creator: Callable[[], Any], games: int = 20, seed: int = 0,
                  greedy: bool = False, max_turns: int = 10_000) -> dict[str, float]:
    """Play ``games`` games of a two-player env (``env_creator()`` builds one PettingZoo env) between
    ``policy`` (sampled actions, or the mode with ``greedy``) and a uniformly random legal opponent.
    Returns the win, draw and loss rates of the policy (by the sign of its seat's return) and ``games``."""
    from packrl.emulation import emulate

    env = emulate(env_creator())
    try:
        if env.num_agents != 2:
            raise ValueError(f"versus_random needs a two-player env; this one has {env.num_agents} agents")
        device = next(policy.parameters()).device
        rng = np.random.default_rng(seed)
        outcomes = []
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for game in range(games):
                seat = game % 2
                totals = _play(policy, env, seat, seed + game, rng, greedy, device, max_turns)
                outcomes.append(np.sign(totals[seat]))
    finally:
        env.close()
    outcomes = np.array(outcomes)
    return {"win": float(np.mean(outcomes > 0)), "draw": float(np.mean(outcomes == 0)),
            "loss": float(np.mean(outcomes < 0)), "games": games}


def _play(policy: Any, env: Any, seat: int, seed: int, rng: np.random.Generator, greedy: bool,
          device: torch.device, max_turns: int) -> np.ndarray:
    """One game; returns each seat's total reward."""
    obs, _ = env.reset(seed=seed)
    totals = np.zeros(env.num_agents)
    state = policy.initial_state(env.num_agents, device)
    starts = torch.ones(env.num_agents, dtype=torch.bool, device=device)
    was_training = policy.training
    policy.eval()
    try:
        for _ in range(max_turns):
            if env.done:
                return totals
            row = int(np.flatnonzero(env.masks)[0])
            logits, _, state = policy.forward_eval(torch.as_tensor(obs).to(device), state, starts)
            starts = torch.zeros_like(starts)
            dist = policy.decoder.distribution(logits.float())
            actions = np.array(policy.decoder.to_numpy(dist.mode() if greedy else dist.sample()))
            if row != seat:
                actions[row] = _random_legal(env, obs, row, rng)
            obs, rewards, _, _, _ = env.step(actions)
            totals += rewards
    finally:
        policy.train(was_training)
    raise RuntimeError(f"a game did not end within {max_turns} turns")


def _random_legal(env: Any, obs: np.ndarray, row: int, rng: np.random.Generator) -> int:
    group = env.emulated.group_for(row)
    if group.action_mask is None:
        return int(rng.integers(group.action.nvec[0]))
    leaves = group.observation.unpack(obs[row, :group.observation.nbytes])
    mask = leaves
    for key in group.action_mask:
        mask = mask[key]
    legal = np.flatnonzero(np.asarray(mask).reshape(-1))
    return int(rng.choice(legal))


def report_versus_random(console: Any, policy: Any, env_id: str, env_kwargs: dict | None, games: int, seed: int,
                         greedy: bool = False) -> dict[str, float] | None:
    """For ``packrl eval``: print the win/draw/loss rates against a random opponent when ``env_id`` is a
    two-player zero-sum game (else do nothing). The id is resolved as data (no code it names is run)."""
    from packrl.train.run import env_creator

    if not is_two_player_zero_sum(env_id):
        return None
    creator, _ = env_creator(env_id, env_kwargs, "aec", allow_code=False)
    rates = versus_random(policy, creator, games, seed=seed, greedy=greedy)
    console.print(f"against a uniformly random legal opponent ({games} games, {'greedy' if greedy else 'sampled'}, "
                  f"seats alternating): win {rates['win']:.2f}, draw {rates['draw']:.2f}, loss {rates['loss']:.2f}",
                  highlight=False)
    return rates
