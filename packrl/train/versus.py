"""Two-player zero-sum games: how a policy scores against a uniformly random legal opponent, and against an
earlier copy of itself. In self-play the mean return of both seats is 0 by construction, so these are the
figures that say whether a policy learned anything.

Each match reports the win, draw and loss rates (by the sign of the policy's total reward in a game) and the
mean reward per game with its 95% confidence half-width: win rate is the measure for connect four, chips per
game are the one for poker, and against a uniformly random opponent rock-paper-scissors scores 0 whatever the
policy does (which is why training also plays the previous check's policy).

The policy plays every seat in turn (game g puts it in seat ``g % 2``); a random opponent picks uniformly among
the legal actions of the observation's action mask, a policy opponent samples its own actions. Games are seeded
from ``seed``, and the policies' sampling runs on a forked torch RNG, so a periodic check in training never
changes the training run.
"""
from __future__ import annotations

import copy
import functools
import math
import re
from typing import Any, Callable

import numpy as np
import torch

from packrl.emulation import emulate
from packrl.train.run import env_creator

ZERO_SUM_GAMES = ("connect_four", "tictactoe", "chess", "go", "leduc_holdem", "texas_holdem", "texas_holdem_no_limit",
                  "rps")
"""PettingZoo classic games (``pettingzoo.classic.<name>_vN``) with two players and zero-sum rewards."""

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: a 95% two-sided interval


NUMBA_GAMES = ("connect_four",)
"""packrl's Numba ports of those games (``packrl.envs``), played through their PettingZoo AEC face."""


def is_two_player_zero_sum(env_id: str) -> bool:
    """True for ``pettingzoo.classic.<game>_vN`` ids of the games in ZERO_SUM_GAMES, and for NUMBA_GAMES."""
    match = re.fullmatch(r"pettingzoo\.classic\.([a-z_]+?)_v\d+", env_id)
    return env_id in NUMBA_GAMES or (bool(match) and match.group(1) in ZERO_SUM_GAMES)


def game_creator(env_id: str, env_kwargs: dict | None, allow_code: bool = True) -> Callable[[], Any]:
    """A creator of one AEC env of the two-player zero-sum game ``env_id``: a Numba port's PettingZoo face, or the
    PettingZoo env the id names."""
    if env_id in NUMBA_GAMES:
        from packrl.envs import pettingzoo_face  # imports Numba: only for a Numba game

        return functools.partial(pettingzoo_face.aec_env, env_id)
    return env_creator(env_id, env_kwargs, "aec", allow_code=allow_code)[0]


def versus_random(policy: Any, env_creator: Callable[[], Any], games: int = 20, seed: int = 0,
                  greedy: bool = False, max_turns: int = 10_000) -> dict[str, float]:
    """Play ``games`` games of a two-player env (``env_creator()`` builds one PettingZoo env) between
    ``policy`` (sampled actions, or the mode with ``greedy``) and a uniformly random legal opponent.
    Returns ``match_stats``: win, draw and loss rates, mean reward per game and its 95% half-width, games."""
    return versus(policy, None, env_creator, games, seed, greedy, max_turns)


@torch.no_grad()
def versus(policy: Any, opponent: Any | None, env_creator: Callable[[], Any], games: int = 20, seed: int = 0,
           greedy: bool = False, max_turns: int = 10_000) -> dict[str, float]:
    """``versus_random`` against ``opponent``: another policy for the same env (sampling its actions), or None
    for the uniformly random legal opponent."""
    env = emulate(env_creator())
    try:
        if env.num_agents != 2:
            raise ValueError(f"a match needs a two-player env; this one has {env.num_agents} agents")
        device = next(policy.parameters()).device
        rng = np.random.default_rng(seed)
        rewards = []
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for game in range(games):
                seat = game % 2
                totals = _play(policy, opponent, env, seat, seed + game, rng, greedy, device, max_turns)
                rewards.append(totals[seat])
    finally:
        env.close()
    return match_stats(np.array(rewards, dtype=np.float64))


def match_stats(rewards: np.ndarray) -> dict[str, float]:
    """Win/draw/loss rates (by the sign of each game's reward), the mean reward per game, and the half-width of
    its 95% confidence interval (normal approximation; 0 for fewer than two games)."""
    n = len(rewards)
    half = Z95 * float(np.std(rewards, ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    return {"win": float(np.mean(rewards > 0)), "draw": float(np.mean(rewards == 0)),
            "loss": float(np.mean(rewards < 0)), "reward": float(np.mean(rewards)), "reward_ci95": half,
            "games": n}


class PreviousPolicy:
    """The previous check's copy of a training policy, for ``versus(policy, previous.policy, ...)``: ``swap``
    returns the copy taken at the last call (None at the first) and keeps a copy of ``policy`` as it is now."""

    def __init__(self) -> None:
        self.policy: Any | None = None

    def swap(self, policy: Any) -> Any | None:
        previous = self.policy
        self.policy = copy.deepcopy(policy).eval()
        return previous


def training_check(env_creator: Callable[[], Any], games: int, seed: int) -> Callable[[Any, int], dict[str, float]]:
    """``check(policy, iteration)`` for a training run's periodic check: the match against a random opponent
    (``vs_random/*``) and, from the second check on, against the policy of the check before (``vs_previous/*``),
    each game seeded from (seed, iteration)."""
    previous = PreviousPolicy()

    def check(policy: Any, iteration: int) -> dict[str, float]:
        stats = {f"vs_random/{k}": v for k, v in
                 versus(policy, None, env_creator, games, seed=seed + 7919 * iteration).items() if k != "games"}
        if (before := previous.swap(policy)) is not None:
            stats.update({f"vs_previous/{k}": v for k, v in
                          versus(policy, before, env_creator, games, seed=seed + 7919 * iteration + 1).items()
                          if k != "games"})
        return stats

    return check


def _play(policy: Any, opponent: Any | None, env: Any, seat: int, seed: int, rng: np.random.Generator, greedy: bool,
          device: torch.device, max_turns: int) -> np.ndarray:
    """One game; returns each seat's total reward."""
    obs, _ = env.reset(seed=seed)
    totals = np.zeros(env.num_agents)
    players = [_Player(policy, env.num_agents, device, greedy)]
    if opponent is not None:
        players.append(_Player(opponent, env.num_agents, device, greedy=False))
    was_training = [p.policy.training for p in players]
    for p in players:
        p.policy.eval()
    try:
        for _ in range(max_turns):
            if env.done:
                return totals
            # every player sees every turn (a recurrent state follows the whole game); only acting rows move
            moves = [p.act(obs) for p in players]
            actions = moves[0]
            for row in np.flatnonzero(env.masks):
                if row != seat:
                    actions[row] = moves[1][row] if opponent is not None else _random_legal(env, obs, row, rng)
            obs, rewards, _, _, _ = env.step(actions)
            totals += rewards
    finally:
        for p, mode in zip(players, was_training):
            p.policy.train(mode)
    raise RuntimeError(f"a game did not end within {max_turns} turns")


class _Player:
    """A policy playing one game: its recurrent state over all rows, its actions for every row."""

    def __init__(self, policy: Any, rows: int, device: torch.device, greedy: bool):
        self.policy, self.greedy, self.device = policy, greedy, device
        self.state = policy.initial_state(rows, device)
        self.starts = torch.ones(rows, dtype=torch.bool, device=device)

    def act(self, obs: np.ndarray) -> np.ndarray:
        logits, _, self.state = self.policy.forward_eval(torch.as_tensor(obs).to(self.device), self.state, self.starts)
        self.starts = torch.zeros_like(self.starts)
        dist = self.policy.decoder.distribution(logits.float())
        return np.array(self.policy.decoder.to_numpy(dist.mode() if self.greedy else dist.sample()))


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
    """For ``packrl eval``: print the win/draw/loss rates and the mean reward per game against a random opponent when ``env_id`` is a
    two-player zero-sum game (else do nothing). The id is resolved as data (no code it names is run)."""
    if not is_two_player_zero_sum(env_id):
        return None
    rates = versus_random(policy, game_creator(env_id, env_kwargs, allow_code=False), games, seed=seed, greedy=greedy)
    console.print(f"against a uniformly random legal opponent ({games} games, {'greedy' if greedy else 'sampled'}, "
                  f"seats alternating): win {rates['win']:.2f}, draw {rates['draw']:.2f}, loss {rates['loss']:.2f}, "
                  f"reward per game {rates['reward']:+.3f} ± {rates['reward_ci95']:.3f} (95%)", highlight=False)
    return rates


def closing_lines(rows: list[dict]) -> list[str]:
    """The closing lines of a two-player zero-sum run (``packrl train``): the last check's score against a random
    opponent and against the previous check's policy, read from the history rows; [] when no check ran."""
    lines = []
    for prefix, who in (("vs_random/", "a uniformly random legal opponent"), ("vs_previous/", "the previous check's policy")):
        row = next((r for r in reversed(rows) if isinstance(r.get(prefix + "win"), (int, float))), None)
        if row is None:
            continue
        games = row.get(prefix + "games")
        lines.append(f"against {who} (iteration {row.get('iteration', '?')}, step {row.get('global_step', 0):,}"
                     + (f", {int(games)} games" if isinstance(games, (int, float)) else "") + "): "
                     f"win {row[prefix + 'win']:.2f}, draw {row[prefix + 'draw']:.2f}, loss {row[prefix + 'loss']:.2f}, "
                     f"reward per game {row[prefix + 'reward']:+.3f} ± {row[prefix + 'reward_ci95']:.3f} (95%)")
    return lines
