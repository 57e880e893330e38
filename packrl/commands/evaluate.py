"""``packrl eval CHECKPOINT``: evaluate a checkpoint's policy on fresh envs, sampled and greedy side by side
(a run folder stands for its newest checkpoint).

The checkpoint is data: the env is the one given with ``--env`` or the recorded id looked up as a name
(``module:function`` ids and their kwargs run only with ``--trust-checkpoint``); its layouts must match the
env's. ``--sha256`` refuses a checkpoint whose manifest hash (printed when it was saved) differs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from packrl.commands.arguments import EVAL_MODES, non_negative_int, positive_float, positive_int
from packrl.config import parse_toml_value
from packrl.errors import ConfigError
from packrl.printing import progress_line, shown
from packrl.run_folders import checkpoint_in, is_run_folder

VIDEO_SUFFIXES = (".gif",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder, or a run folder (its newest checkpoint)")
    parser.add_argument("--episodes", type=positive_int, default=20, help="episodes per mode (default 20)")
    parser.add_argument("--num-envs", type=positive_int, default=None, help="envs stepped together (default min(episodes, 8))")
    parser.add_argument("--seed", type=non_negative_int, default=10_000, help="env and sampling seed (default 10000)")
    parser.add_argument("--device", default="cpu", help="torch device of the policy (default cpu)")
    parser.add_argument("--mode", choices=tuple(EVAL_MODES), default="sampled",
                        help="the headline return and the rendered episode: sampled (as trained; the default) or greedy")
    parser.add_argument("--env", help="the env to evaluate on (default: the recorded id, looked up as a name)")
    parser.add_argument("--env-kwargs", type=_kwargs_table, default=None, metavar="TABLE",
                        help="kwargs for --env, or without --env over the run's recorded kwargs, as a TOML inline "
                             "table, as train's --env.kwargs takes them ('{size = 8}'; a JSON object is read too)")
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="RISK: let the checkpoint's env id and kwargs import and call code (module:function); "
                             "only for checkpoints whose author you trust")
    parser.add_argument("--sha256", help="the manifest hash printed at save time; any other checkpoint is refused")
    parser.add_argument("--max-policy-gib", type=positive_float, default=2.0, metavar="GIB",
                        help="refuse a checkpoint whose policy would take more than this (default 2; a policy may "
                             "also take at most 4x its weights file)")
    parser.add_argument("--render", metavar="OUT.gif", type=_video_path,
                        help="also write one episode of env 0 as a GIF (the env must render rgb_array)")


def run(args: argparse.Namespace) -> int:
    return eval_command(args.checkpoint, args.episodes, num_envs=args.num_envs, seed=args.seed, device=args.device,
                        mode=args.mode, env=args.env, env_kwargs=args.env_kwargs,
                        trust_checkpoint=args.trust_checkpoint, sha256=args.sha256, render=args.render,
                        max_policy_bytes=int(args.max_policy_gib * (1 << 30)))


def eval_command(checkpoint: str, episodes: int = 20, *, num_envs: int | None = None, seed: int = 10_000,
                 device: str = "cpu", mode: str = "sampled", env: str | None = None, env_kwargs: dict | None = None,
                 trust_checkpoint: bool = False, sha256: str | None = None, render: str | None = None,
                 max_policy_bytes: int | None = None) -> int:
    """Evaluate both modes on ``num_envs`` serial envs (Numba envs batch natively) and print them side by
    side; returns 0, or 1 when an episode cannot be scored (a non-finite reward, an episode that never ends).
    Results go to stdout; on a terminal, a line at start and one per batch of episodes to stderr. Like
    ``packrl train``, torch runs on one CPU thread unless OMP_NUM_THREADS says otherwise."""
    _check_exists(checkpoint)  # before torch: a mistyped path is refused at once
    given = checkpoint
    found = checkpoint_in(checkpoint)
    checkpoint = str(found.checkpoint)
    progress_line(f"eval: {shown(checkpoint)}: loading the policy and making its envs")  # torch takes seconds

    from packrl.commands.evaluation import evaluate_checkpoint  # torch and the envs: seconds

    return evaluate_checkpoint(found, given, episodes, num_envs=num_envs, seed=seed, device=device,
                               mode=mode, env=env, env_kwargs=env_kwargs, trust_checkpoint=trust_checkpoint,
                               sha256=sha256, render=render, max_policy_bytes=max_policy_bytes)


def _check_exists(path: str) -> None:
    """A CHECKPOINT that names nothing is one line saying so, before torch is imported (not a complaint about
    what a folder lacks)."""
    if not Path(path).exists():
        raise ConfigError(f"checkpoint {shown(path)}: no such folder")
    if not Path(path).is_dir():
        raise ConfigError(f"checkpoint {shown(path)}: not a folder (give a checkpoint folder or a run folder)")
    if not (Path(path) / "metadata.json").is_file() and not is_run_folder(Path(path)):
        raise ConfigError(f"checkpoint {shown(path)}: holds no metadata.json and is not a run folder (give a "
                          "checkpoint folder or a run folder)")


def _kwargs_table(text: str) -> dict:
    """``--env-kwargs``: a TOML inline table, as ``train --env.kwargs`` takes it; a JSON object is read too
    (the form this flag took before)."""
    value = parse_toml_value(text)  # the text itself when it is no TOML value
    if isinstance(value, str):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a table such as '{{size = 8}}', got {shown(text)!r}")
    return value


def _video_path(text: str) -> str:
    if not text.lower().endswith(VIDEO_SUFFIXES):
        raise argparse.ArgumentTypeError(f"{text!r}: the video is written as {', '.join(VIDEO_SUFFIXES)}")
    return text
