"""The ``packrl`` command: ``packrl train ENV``, ``packrl eval CHECKPOINT``, ``packrl check ENV``.

Settings come from DEFAULTS, then ``--config FILE`` (TOML or INI, sections env/vec/policy/train), then
flags: the shortcuts below, or any ``--section.key VALUE`` (``--train.learning_rate 1e-3``).
"""
from __future__ import annotations

import argparse
import sys

import packrl.commands.check
import packrl.commands.evaluate
import packrl.commands.inspect
import packrl.commands.train
from packrl import commands
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
    for flag in SHORTCUTS:
        train.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=str)
    commands.train.add_arguments(train)

    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on its env")
    commands.evaluate.add_arguments(evaluate)
    inspect = sub.add_parser("inspect", help="print a checkpoint's metadata and tensors without loading it (no torch)")
    commands.inspect.add_arguments(inspect)

    check = sub.add_parser("check", help="shape, dtype, range, NaN and gradient checks of ENV with its policy")
    check.add_argument("env", nargs="?")
    check.add_argument("--config")
    for flag in SHORTCUTS:
        check.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=str)
    commands.check.add_arguments(check)
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


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["inspect"]:  # before build_parser, which imports torch
        return commands.inspect.main((sys.argv[1:] if argv is None else list(argv))[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "eval":
            if extra:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            return commands.evaluate.run(args)
        config = _config(args, extra)
        if args.command == "train":
            return commands.train.run(args, config)
        return commands.check.run(args, config)
    except PackrlError as err:
        print(f"packrl {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
