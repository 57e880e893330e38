"""The packrl command trains, evaluates, inspects, checks and plots reinforcement-learning runs.

``packrl train ENV``, ``packrl eval CHECKPOINT``, ``packrl inspect CHECKPOINT``, ``packrl check ENV``,
``packrl configs``, ``packrl plot RUN``. Settings come from the defaults, then the env family's preset
(``packrl configs`` lists them), then ``--config FILE`` (TOML; sections env/vec/policy/train), then flags: one
typed flag per config field (``--train.learning_rate 1e-3`` or ``--train.learning_rate=1e-3``) and the shortcuts
``--total-steps``, ``--seed``, ``--device``, ``--num-envs``, ``--backend``, ``--num-workers``, ``--network``,
``--hidden``. A bad value, flag, env id or path is one line on stderr and exit status 2, found before torch or
numba is imported.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import TYPE_CHECKING

import packrl.commands.check
import packrl.commands.configs
import packrl.commands.evaluate
import packrl.commands.inspect
import packrl.commands.train  # noqa: F401 - loads commands.train, which main() reads
from packrl import __version__, commands, presets
from packrl import config as config_settings
from packrl.commands import plot, sweep
from packrl.commands.arguments import SHORTCUTS, description
from packrl.errors import PackrlError
from packrl.run_folders import printable

if TYPE_CHECKING:  # imported where used: `packrl --help` starts without them
    from packrl.config import Setting
    from packrl.presets import Preset

CONFIG_COMMANDS = ("train", "check")
CHECK_SECTIONS = ("env", "vec", "policy")
"""The settings ``packrl check`` reads (it builds the envs and the policy; it does not train), with ``--seed``."""
SECTION_TITLES = {
    "env": "env settings ([env] in a config file)", "vec": "vector settings ([vec])",
    "policy": "policy settings ([policy])", "train": "training settings ([train]: total_steps and PPOConfig)",
}
_NUMBER = re.compile(r"-(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?|-inf|-nan")


ALIASES = {"lr": "learning_rate", "epochs": "update_epochs", "minibatches": "num_minibatches", "envs": "num_envs",
           "workers": "num_workers", "steps": "total_steps", "rollout": "num_steps", "clip": "clip_coef",
           "ent": "ent_coef", "entropy": "ent_coef", "vf": "vf_coef"}
"""Common short names of settings, for the suggestion after an unknown flag (``--lr`` -> ``--train.learning_rate``)."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) and a close match for an unknown flag, among the flags of the
    subcommand given (``command``, set by ``main``)."""

    known_flags: dict[str, list[str]] = {}  # subcommand -> its flags
    command: str | None = None

    def error(self, message: str) -> None:  # type: ignore[override]
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        if unknown and unknown.group(1).startswith("--"):
            flag = unknown.group(1).partition("=")[0]
            close = suggest(flag, Parser.known_flags.get(Parser.command or "", []))
            prog = f"packrl {Parser.command}" if Parser.command else self.prog
            message = f"unknown flag {flag}" + (f" (did you mean {', '.join(close)}?)" if close else "")
            self.exit(2, f"{prog}: error: {message} (see {prog} --help)\n")
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def suggest(flag: str, flags: list[str]) -> list[str]:
    """Up to three flags close to ``flag``: the same setting under its section (``--gamma`` ->
    ``--train.gamma``, ``--lr`` -> ``--train.learning_rate``), else by spelling."""
    name = flag.lstrip("-").replace("-", "_")
    name = ALIASES.get(name, name)
    same = [f for f in flags if f.rpartition(".")[2].lstrip("-").replace("-", "_") == name]
    if same:
        return same[:3]
    return difflib.get_close_matches(flag, [f for f in flags if f not in ("--help", "--version")], n=3, cutoff=0.6)


def build_parser() -> Parser:
    parser = Parser(prog="packrl", description=description(__doc__), allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"packrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    settings = config_settings.settings()
    preset_values = _preset_values(presets.PRESETS)
    preset_lines = "\n".join(f"  {p.name:20} {', '.join(p.patterns)}" for p in presets.PRESETS)
    epilog = (f"presets (chosen from the env id; `packrl configs` shows what each sets):\n{preset_lines}\n"
              "precedence: defaults < preset < --config file < flags")

    train = sub.add_parser("train", help=COMMAND_HELP["train"], description=description(commands.train.__doc__),
                           epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                           usage="packrl train [ENV] [--config FILE] [--preset NAME] [--section.key VALUE ...] [options]")
    _add_config_arguments(train, settings, preset_values)
    commands.train.add_arguments(train)

    evaluate = sub.add_parser("eval", help=COMMAND_HELP["eval"], description=description(commands.evaluate.__doc__),
                              allow_abbrev=False)
    commands.evaluate.add_arguments(evaluate)
    inspect = sub.add_parser("inspect", help=COMMAND_HELP["inspect"])
    commands.inspect.add_arguments(inspect)

    check = sub.add_parser("check", help=COMMAND_HELP["check"], description=description(commands.check.__doc__),
                           usage="packrl check [ENV] [--config FILE] [--preset NAME] [--section.key VALUE ...] [options]",
                           epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    _add_config_arguments(check, settings, preset_values, sections=CHECK_SECTIONS, extra_shortcuts=("seed",))
    commands.check.add_arguments(check)

    configs = sub.add_parser("configs", help=COMMAND_HELP["configs"], description=description(commands.configs.__doc__),
                             allow_abbrev=False)
    commands.configs.add_arguments(configs)

    Parser.known_flags = {name: _long_flags(p) for name, p in sub.choices.items()}
    return parser


def _long_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The ``--`` flags of ``parser`` and its argument groups, for close matches to a misspelt one."""
    actions = parser._actions  # noqa: SLF001 - argparse lists a parser's actions only on this attribute
    return sorted({o for a in actions for o in a.option_strings if o.startswith("--")})


def _add_config_arguments(parser: argparse.ArgumentParser, settings: dict, preset_values: dict[str, str],
                          sections: tuple[str, ...] = tuple(SECTION_TITLES), extra_shortcuts: tuple[str, ...] = ()) -> None:
    """ENV, --config, --preset, the shortcuts and one flag per setting of ``sections`` (dest ``cfg:section.key``,
    default None: only the flags given reach the config), and the shortcuts ``extra_shortcuts`` of other sections.
    A setting a preset changes says which presets set it to what."""
    parser.add_argument("env", nargs="?", help="env id: a packrl env (gridworld, cartpole), a gymnasium id "
                        "(CartPole-v1), module:EnvId (minigrid:MiniGrid-Empty-5x5-v0), a MiniGrid-*/BabyAI-* id, "
                        "a PettingZoo module path (pettingzoo.classic.connect_four_v3) or module:function "
                        "(sets env.id)")
    parser.add_argument("--config", metavar="FILE", help="TOML file with [env] [vec] [policy] [train] sections")
    parser.add_argument("--preset", default="auto", metavar="NAME",
                        help="auto (by env id), none, or a preset name (default: auto; list: packrl configs)")
    shortcuts = parser.add_argument_group("shortcuts")
    for flag, key in SHORTCUTS.items():
        if key.partition(".")[0] not in sections and flag not in extra_shortcuts:
            continue
        s = settings[key]
        shortcuts.add_argument(f"--{flag.replace('_', '-')}", dest=f"short:{flag}", metavar=_metavar(s),
                               help=f"= {s.flag}")
    groups = {section: parser.add_argument_group(SECTION_TITLES[section]) for section in sections}
    for s in settings.values():
        if s.section not in sections:
            continue
        by_preset = f"; presets: {preset_values[s.key]}" if s.key in preset_values else ""
        groups[s.section].add_argument(
            s.flag, dest=f"cfg:{s.key}", metavar=_metavar(s), **({"nargs": "?", "const": "true"} if s.base is bool else {}),
            help=f"{s.help} ({_bounds(s)}default: {_default_text(s)}{by_preset})".replace("%", "%%"))


def _preset_values(presets: tuple[Preset, ...]) -> dict[str, str]:
    """``{"train.learning_rate": "classic-control 0.001, gridworld 0.002, ..."}``: what each preset sets a setting to
    (``train --help`` shows it beside the default, so a user sees the value their env trains with)."""
    out: dict[str, list[str]] = {}
    for preset in presets:
        for key, value in preset.items():
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            out.setdefault(key, []).append(f"{preset.name} {shown}")
    return {key: ", ".join(values) for key, values in out.items()}


def _metavar(s: Setting) -> str:
    if s.choices:
        return "{" + ",".join(s.choices) + "}"
    if s.base is bool:
        return "{true,false}"
    return {int: "INT", float: "FLOAT", str: "TEXT"}.get(s.base, "TABLE")


def _bounds(s: Setting) -> str:
    """The range of a number (the type and choices are in the metavar)."""
    text = str(s.range) if s.range is not None else ""
    if s.optional:
        text = f"{text} or none" if text else "or none"
    return f"{text}; " if text else ""


def _default_text(s: Setting) -> str:
    if s.default is None:
        return "none"
    if isinstance(s.default, bool):
        return str(s.default).lower()
    return "{}" if s.default == {} else str(s.default)


def normalize_argv(argv: list[str]) -> list[str]:
    """``--train.learning-rate`` -> ``--train.learning_rate``; ``--train.ent_coef -1e-3`` -> ``--train.ent_coef=-1e-3``
    (argparse would read a negative number in exponent form as a flag)."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":  # what follows is positional, as it is
            out.extend(argv[i:])
            break
        if token.startswith("--") and "." in token.partition("=")[0]:
            name, eq, value = token.partition("=")
            section, _, key = name.partition(".")
            token = f"{section}.{key.replace('-', '_')}{eq}{value}"
        if out and _NUMBER.fullmatch(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
            continue
        out.append(token)
    return out


def config_from_args(args: argparse.Namespace) -> tuple[dict, object]:
    """The checked config of a train/check command line and the preset it used: defaults < preset < file < flags."""
    settings = config_settings.settings()
    flags: dict[str, dict] = {}
    given = [(settings[SHORTCUTS[d[6:]]], f"--{d[6:].replace('_', '-')}", text) for d, text in vars(args).items()
             if d.startswith("short:") and text is not None]
    given += [(settings[d[4:]], None, text) for d, text in vars(args).items() if d.startswith("cfg:") and text is not None]
    for setting, flag, text in given:  # a --section.key flag wins over its shortcut
        flags.setdefault(setting.section, {})[setting.name] = setting.parse(text, flag=flag)
    if args.env:
        flags.setdefault("env", {})["id"] = args.env
    file_layer = None
    if args.config:
        from packrl.train.run import load_config_file  # imports torch: only for a command line that names a file

        file_layer = load_config_file(args.config)
    args.env_from_file = bool(file_layer and (file_layer.get("env") or {}).get("id"))
    return config_settings.resolve(file_layer, config_settings.ConfigLayer(flags, "command line"), args.preset)


COMMAND_HELP = {
    "train": "train PPO on ENV", "eval": "evaluate a checkpoint on its env",
    "inspect": "print a checkpoint's metadata and tensors without loading it (no torch)",
    "check": "shape, dtype, range, NaN and gradient checks of ENV with its policy",
    "configs": "list the presets and what each sets; NAME prints one as TOML",
    "plot": "draw a run's learning curve from its history.jsonl (needs matplotlib: packrl[plot])",
    "sweep": "hyperparameter search on Optuna: packrl sweep ENV, packrl sweep show SWEEP (needs packrl[sweep])",
}


def top_level(argv: list[str]) -> int | None:
    """``packrl``, ``packrl --help``, ``packrl --version`` and an unknown command without building the
    subcommands' parsers: instant. None for every other command line."""
    if argv[:1] and not argv[0].startswith("-") and argv[0] not in COMMAND_HELP:
        close = difflib.get_close_matches(argv[0], list(COMMAND_HELP), n=1, cutoff=0.5)
        print(f"packrl: error: unknown command {printable(argv[0])!r}" + (f" (did you mean {close[0]}?)" if close else "")
              + f"; the commands: {', '.join(COMMAND_HELP)} (see packrl --help)", file=sys.stderr)
        return 2
    if argv not in ([], ["-h"], ["--help"], ["--version"]):
        return None
    parser = Parser(prog="packrl", description=description(__doc__), allow_abbrev=False,
                    epilog="`packrl COMMAND --help` lists each command's options")
    parser.add_argument("--version", action="version", version=f"packrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in COMMAND_HELP.items():
        sub.add_parser(name, help=text)
    parser.parse_args(argv)  # prints help or the version and exits; no command: argparse's one-line error
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``packrl`` command. A reader that closes the pipe early (``packrl configs | head``) ends the output
    quietly, with the status a shell gives a command whose reader left (128 + SIGPIPE)."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python flushes stdout again at exit and would fail again: point it at /dev/null (the Python docs' recipe)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["inspect"]:  # before build_parser, which imports torch
        return commands.inspect.main((sys.argv[1:] if argv is None else list(argv))[1:])
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["sweep"]:  # its own parser (packrl.commands.sweep)
        return sweep.main((sys.argv[1:] if argv is None else list(argv))[1:])
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["plot"]:  # likewise without torch
        return plot.main((sys.argv[1:] if argv is None else list(argv))[1:])
    quick = top_level(list(sys.argv[1:] if argv is None else argv))
    if quick is not None:
        return quick
    parser = build_parser()
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    Parser.command = next((token for token in argv if not token.startswith("-")), None)
    args = parser.parse_args(argv)
    try:
        if args.command == "eval":
            return commands.evaluate.run(args)
        if args.command == "configs":
            return commands.configs.run(args)
        config, preset = config_from_args(args)
        from packrl.env_ids import env_creator  # not packrl.train.run: no torch before a bad env id
        from packrl.printing import shown

        if args.command == "train" and args.name is not None:
            from packrl.run_folders import check_name

            check_name(args.name)
        env_creator(config["env"]["id"], config["env"]["kwargs"], config["env"]["api"])
        if args.command == "train":
            if args.env is None and args.resume is None and not args.env_from_file:
                print(f"packrl train: no ENV given: training {config['env']['id']!r}, packrl's default env.id "
                      "(name one: packrl train CartPole-v1)", file=sys.stderr)
            if sys.stdout.isatty() and os.environ.get("RANK", "0") == "0":  # torch, the envs and a JIT take seconds
                print(f"packrl train: starting {shown(config['env']['id'])}: importing torch, making the envs and "
                      "the policy", flush=True)
            # the preset line comes once the run is set up (no line before an error found later); a resumed
            # run prints what it resumes instead: its recorded settings, not this command line's preset
            args.preamble = None if args.resume is not None else _preset_line(preset, config)
            return commands.train.run(args, config)
        return commands.check.run(args, config)
    except PackrlError as err:
        from packrl.run_folders import error_line

        print(f"packrl {args.command}: {error_line(err)}", file=sys.stderr)  # one line, control characters escaped
        return 2


def _preset_line(preset: Preset | None, config: dict) -> str:
    if preset is None:
        return f"preset: none for {config['env']['id']!r} (packrl's defaults; `packrl configs` lists the presets)"
    return (f"preset: {preset.name} ({preset.summary}); flags and --config override it, --preset none turns it off")


if __name__ == "__main__":
    sys.exit(main())
