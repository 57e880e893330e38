"""``packrl train ENV``: train PPO, then save the checkpoint, history and learning curve."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/latest", help="folder for the checkpoint, curve and history")
    parser.add_argument("--tensorboard", metavar="LOGDIR", help="also log to TensorBoard (needs the tensorboard package)")
    parser.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live dashboard")


def run(args: argparse.Namespace, config: dict) -> int:
    return train_command(config, args.out, live=not args.no_live, tensorboard=args.tensorboard)


def train_command(config: dict, out: str | Path, live: bool = True, tensorboard: str | None = None) -> int:
    """Train, then save the checkpoint, history and learning curve into ``out``. Ctrl-C stops the training,
    still saves everything, and returns 130."""
    from rich.console import Console

    from packrl.train.dashboard import Dashboard
    from packrl.train.ppo import PPO
    from packrl.train.run import make_policy, make_vecenv, plot_learning_curve, ppo_config, save, write_history

    console = Console()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = ppo_config(config)
    vecenv = make_vecenv(config, seed=cfg.seed)
    history: list[dict] = []
    interrupted = False
    try:
        ppo = PPO(vecenv, make_policy(vecenv, config["policy"]), cfg)
        total = int(config["train"]["total_steps"])
        title = f"packrl PPO on {config['env']['id']} ({vecenv.num_agents} rows, {ppo.device})"

        with Dashboard(title, total, live=live and console.is_terminal, tensorboard=tensorboard, console=console) as board:
            def callback(stats: dict) -> None:
                history.append(stats)
                board.update(stats)

            try:
                ppo.train(total, callback)
            except KeyboardInterrupt:
                interrupted = True
        checkpoint = save(ppo, config, out / "checkpoint", history)
        write_history(history, out / "history.jsonl")
        curve = plot_learning_curve(history, out / "learning_curve.png", title)
    finally:
        vecenv.close()
    if interrupted:
        console.print(f"[yellow]interrupted at {ppo.global_step:,} steps[/yellow]")
    returns = [h["episode_return"] for h in history if "episode_return" in h]
    if returns:
        console.print(f"last mean episode return {returns[-1]:.3f} after {ppo.global_step:,} agent steps")
    console.print(f"checkpoint: {checkpoint}")
    console.print(f"learning curve: {curve if curve else '(no episode ended, no curve)'}")
    return 130 if interrupted else 0
