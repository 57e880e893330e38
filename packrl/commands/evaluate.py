"""``packrl eval CHECKPOINT``: the mean return of a checkpoint's policy on its env."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the mode")


def run(args: argparse.Namespace) -> int:
    return eval_command(args.checkpoint, args.episodes, not args.stochastic)


def eval_command(checkpoint: str, episodes: int, deterministic: bool = True) -> int:
    from rich.console import Console

    from packrl.train.evaluate import evaluate
    from packrl.train.run import load_policy, make_vecenv

    policy, metadata, env = load_policy(checkpoint)
    env.close()
    config = metadata["config"]
    config["vec"].update(num_envs=episodes)
    vecenv = make_vecenv(config, seed=10_000)
    try:
        returns = evaluate(policy, vecenv, deterministic=deterministic)
    finally:
        vecenv.close()
    Console().print(f"{metadata['env_id']}: mean return {returns.mean():.3f} +- {returns.std():.3f} over "
                    f"{len(returns)} episodes (min {returns.min():.3f}, max {returns.max():.3f}; "
                    f"trained {metadata.get('global_step', '?'):,} steps)")
    return 0
