"""The ``packrl`` command: ``packrl train ENV``, ``packrl eval CHECKPOINT``, ``packrl check ENV``.

Settings come from DEFAULTS, then ``--config FILE`` (TOML or INI, sections env/vec/policy/train), then
flags: the shortcuts below, or any ``--section.key VALUE`` (``--train.learning_rate 1e-3``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from packrl.errors import PackrlError

SHORTCUTS = {  # flag -> (section, key)
    "total_steps": ("train", "total_steps"), "seed": ("train", "seed"), "device": ("train", "device"),
    "num_envs": ("vec", "num_envs"), "backend": ("vec", "backend"), "num_workers": ("vec", "num_workers"),
    "network": ("policy", "network"), "hidden": ("policy", "hidden"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="packrl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train PPO on ENV (gymnasium id, pettingzoo.* path, packrl env, module:function)")
    train.add_argument("env", nargs="?", help="env id (overrides env.id of the config)")
    train.add_argument("--config", help="TOML or INI file with [env] [vec] [policy] [train] sections")
    train.add_argument("--out", default="runs/latest", help="folder for the checkpoint, curve and history")
    train.add_argument("--tensorboard", metavar="LOGDIR", help="also log to TensorBoard (needs the tensorboard package)")
    train.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live dashboard")
    for flag in SHORTCUTS:
        train.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=str)

    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on its env")
    evaluate.add_argument("checkpoint")
    evaluate.add_argument("--episodes", type=int, default=20)
    evaluate.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the mode")

    check = sub.add_parser("check", help="shape, dtype, range, NaN and gradient checks of ENV with its policy")
    check.add_argument("env", nargs="?")
    check.add_argument("--config")
    check.add_argument("--steps", type=int, default=64)
    for flag in SHORTCUTS:
        check.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=str)
    return parser


def _config(args: argparse.Namespace, extra: list[str]) -> dict:
    from packrl.train.run import ConfigError, load_config_file, merge_config, parse_value

    layers = [load_config_file(args.config)] if args.config else []
    flags: dict[str, dict] = {}
    for flag, (section, key) in SHORTCUTS.items():
        if getattr(args, flag, None) is not None:
            flags.setdefault(section, {})[key] = parse_value(getattr(args, flag))
    if args.env:
        flags.setdefault("env", {})["id"] = args.env
    it = iter(extra)
    for token in it:
        name, eq, value = token.partition("=")
        if not name.startswith("--") or "." not in name:
            raise ConfigError(f"unknown argument {token!r}; settings are written --section.key VALUE")
        if not eq:
            value = next(it, None)
            if value is None:
                raise ConfigError(f"{name} needs a value")
        section, _, key = name[2:].partition(".")
        flags.setdefault(section, {})[key.replace("-", "_")] = parse_value(value)
    return merge_config(*layers, flags)


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


def check_command(config: dict, steps: int) -> int:
    from packrl.check import check_env, print_report
    from packrl.train.run import make_policy, make_vecenv

    vecenv = make_vecenv(config, seed=int(config["train"].get("seed", 0)))
    try:
        report = check_env(vecenv, make_policy(vecenv, config["policy"]), steps=steps)
    finally:
        vecenv.close()
    print_report(report, title=f"packrl check {config['env']['id']}")
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "eval":
            if extra:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            return eval_command(args.checkpoint, args.episodes, not args.stochastic)
        config = _config(args, extra)
        if args.command == "train":
            return train_command(config, args.out, live=not args.no_live, tensorboard=args.tensorboard)
        return check_command(config, args.steps)
    except PackrlError as err:
        print(f"packrl {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
