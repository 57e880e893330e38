"""The evaluation behind ``packrl eval`` (``packrl.commands.evaluate`` checks the command line first, without
torch): the policy loaded once from the verified checkpoint, both modes evaluated side by side, the table, the
time-limit note, the versus-random line and the video."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import imageio.v3 as iio
import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from packrl.checkpoint import CheckpointError, verify
from packrl.commands.arguments import EVAL_MODES as MODES
from packrl.errors import ConfigError, EnvError
from packrl.printing import plural, progress_line, shown
from packrl.run_folders import Found, printable, write_file
from packrl.torch_threads import apply_torch_threads
from packrl.train.evaluate import EvaluationError, evaluate_episodes, record_frames
from packrl.train.run import checkpoint_vecenv, load_policy
from packrl.train.versus import report_versus_random


def evaluate_checkpoint(found: Found, given: str, episodes: int, *, num_envs: int | None,
                        seed: int, device: str, mode: str, env: str | None, env_kwargs: dict | None,
                        trust_checkpoint: bool, sha256: str | None, render: str | None,
                        max_policy_bytes: int | None) -> int:
    """``eval_command`` once the checkpoint is found (``found``: the folder, the newer ones that do not load, and
    what verifying it read when it was chosen in a run folder; ``given`` as the user named it): load, evaluate
    both modes, print the table."""
    console = Console()
    _check_device(device)
    apply_torch_threads(None)
    checkpoint = str(found.checkpoint)
    for line in found.skipped:  # newer checkpoints that do not load: named, then passed over
        console.print(escape(printable(f"skipped {line}")), highlight=False, soft_wrap=True)
    if checkpoint != given:
        console.print(f"checkpoint: {escape(printable(checkpoint))}", highlight=False, soft_wrap=True)
    num_envs = num_envs or min(episodes, 8)
    # the one read and hash of the checkpoint (a run folder's newest was verified when chosen; the video reuses it)
    verified = verify(found.verified or checkpoint, sha256)
    policy, metadata, vecenv = load_policy(verified, device, env=env, env_kwargs=env_kwargs,
                                           trust_checkpoint=trust_checkpoint, expected_sha256=sha256,
                                           num_envs=num_envs, seed=seed,
                                           **({} if max_policy_bytes is None else {"max_policy_bytes": max_policy_bytes}))
    env_id = env or metadata["config"]["env"]["id"]
    video = None
    if render:  # before the evaluation: an env that cannot render fails first, by name
        try:
            video = write_video(verified, policy, render, mode=mode, seed=seed, device=device, env=env,
                                env_kwargs=env_kwargs, trust_checkpoint=trust_checkpoint, env_id=env_id)
        except BaseException:
            vecenv.close()
            raise
    results = {}
    per_env = int(getattr(vecenv, "agents_per_env", 1))
    progress_line(f"eval: {shown(env_id)}, {episodes} episodes per mode (sampled, then greedy) on "
                   f"{plural(vecenv.num_agents // per_env, 'env')}")
    started = time.monotonic()
    try:
        for name, deterministic in MODES.items():
            results[name] = evaluate_episodes(policy, vecenv, deterministic=deterministic, seed=seed, device=device,
                                              episodes=episodes,
                                              progress=_batch_progress(name, episodes, per_env, started))
    except (EvaluationError, EnvError) as err:  # the env or its episodes, not the command line: exit 1
        last = [line for line in str(err).strip().splitlines() if line.strip()][-1].strip()
        print(f"packrl eval: {printable(last)}", file=sys.stderr)
        return 1
    finally:
        vecenv.close()
    agents = f" ({per_env} agents each: the returns are per agent)" if per_env > 1 else ""
    table = Table(title=escape(shown(f"{env_id}: {episodes} episodes per mode{agents}, seed {seed}, "
                                     f"trained {_steps(metadata.get('global_step'))} steps")))
    for column in ("mode", "mean return", "std", "min", "max", "time limit"):  # the title gives the episodes
        table.add_column(column, justify="left" if column == "mode" else "right", no_wrap=column == "mode")
    table.caption = ("sampled: actions drawn from the policy, as in training; greedy: its most likely action "
                     "(never a draw, so it can repeat one state's action forever); time limit: the episodes "
                     "of the mode that the env's time limit cut")
    for name, ended in results.items():
        returns = ended.returns
        label = name + ((" (default)" if name == "sampled" else " (--mode)") if name == mode else "")
        table.add_row(label, *(_number(x) for x in (returns.mean(), returns.std(), returns.min(), returns.max())),
                      f"{_cut_episodes(ended.truncated, per_env)} of {episodes}")
    console.print(table)
    note = time_limit_note(results["sampled"], results["greedy"], per_env)
    if note:
        console.print(note, highlight=False, soft_wrap=True)
    console.print(f"mean return {results[mode].returns.mean():.3f} ("
                  + ("sampled, the default; see --mode" if mode == "sampled" else f"{mode}, as --mode asked") + ")")
    # two-player zero-sum games: win/draw/loss against a random opponent
    kwargs = env_kwargs if env else {**(metadata["config"]["env"].get("kwargs") or {}), **(env_kwargs or {})}
    report_versus_random(console, policy, env_id, kwargs, episodes, seed, greedy=MODES[mode])
    if env is not None and env != metadata["config"]["env"]["id"]:
        console.print(escape(f"note: trained on {metadata['config']['env']['id']!r}, evaluated on {env!r} "
                             "(its layouts match)"))
    if video is not None:
        console.print(f"video: {escape(printable(str(video)))}")
    return 0


def write_video(verified: object, policy: object, out: str, *, mode: str, seed: int, device: str, env: str | None,
                env_kwargs: dict | None, trust_checkpoint: bool, env_id: str = "the env") -> Path:
    """One episode of env 0 under the loaded ``policy``, rendered as ``rgb_array`` and written with imageio.
    The env is made again from the ``verified`` checkpoint (``packrl.checkpoint.Verified``: nothing is read or
    hashed again) with ``render_mode='rgb_array'``. An env that cannot be made so, does not list it in its
    ``render_modes`` or renders no frame is one ConfigError naming it."""
    cannot = f"--render: {env_id!r} cannot render rgb_array frames"
    _headless_gl()
    try:
        vecenv = checkpoint_vecenv(verified, env=env, env_kwargs=env_kwargs, trust_checkpoint=trust_checkpoint,
                                   num_envs=1, seed=seed, render_mode="rgb_array")
    except (CheckpointError, ConfigError, EnvError, TypeError, ValueError) as err:
        raise ConfigError(f"{cannot}: it could not be made with render_mode='rgb_array' "
                          f"({' '.join(str(err).split())[-200:]})") from None
    try:
        if not hasattr(vecenv, "envs"):
            raise ConfigError(f"{cannot}: it is batched natively (Numba) and has no per-env render")
        inner = getattr(vecenv.envs[0], "env", vecenv.envs[0])
        modes = (getattr(inner, "metadata", None) or {}).get("render_modes", [])
        if "rgb_array" not in modes:
            raise ConfigError(f"{cannot}: its metadata['render_modes'] is {list(modes)!r}")
        try:
            frames = record_frames(policy, vecenv, deterministic=MODES[mode], seed=seed, device=device)
        except EvaluationError as err:
            raise ConfigError(f"{cannot}: {err}") from None
        except Exception as err:  # a renderer's own failure (no OpenGL context, ...): one line
            if not type(err).__module__.startswith(("mujoco", "OpenGL", "pygame")):
                raise
            raise ConfigError(f"{cannot}: {type(err).__name__}: {' '.join(str(err).split())[:200]} (MUJOCO_GL="
                              f"{os.environ.get('MUJOCO_GL', '')!r}; try MUJOCO_GL=egl or osmesa)") from None
    finally:
        vecenv.close()
    gif = iio.imwrite("<bytes>", frames, extension=Path(out).suffix, duration=50, loop=0)
    return write_file(Path(out).parent, Path(out).name, gif)  # as every file packrl writes: never through a symlink


def _number(x: float) -> str:
    """A return in at most 8 characters (the table fits 80 columns): 3 decimals below 100, fewer above."""
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}" if abs(x) < 100_000 else f"{x:.4g}"


def _headless_gl() -> None:
    """Without a display, MuJoCo's default OpenGL (GLFW) cannot open a context: render through EGL instead,
    unless the user chose a backend (MUJOCO_GL, read when the first renderer is made). pygame (gymnasium's
    classic control) draws rgb_array frames off screen: SDL's dummy video driver, unless SDL_VIDEODRIVER is set,
    so SDL does not look for a display and print its XDG_RUNTIME_DIR line."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("MUJOCO_GL")):
        os.environ["MUJOCO_GL"] = "egl"
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")


def _check_device(device: str) -> None:
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device!r}: this machine has no CUDA device")


def _steps(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def time_limit_note(sampled: object, greedy: object, per_env: int = 1) -> str | None:
    """A note when greedy ran into the time limit more often than sampled *and* those cut greedy episodes
    scored below the sampled mean: then the argmax policy likely repeated itself where sampling broke out (a
    MiniGrid agent turning in place). None otherwise: where running to the time limit is the env's best outcome
    (a perfect CartPole), the cut episodes score at least as well as sampled ones and no note is printed."""
    more = _cut_episodes(greedy.truncated, per_env) - _cut_episodes(sampled.truncated, per_env)
    if more <= 0:
        return None
    cut_mean, sampled_mean = float(greedy.returns[greedy.truncated].mean()), float(sampled.returns.mean())
    if cut_mean >= sampled_mean:
        return None
    return (f"note: {more} more greedy than sampled episodes ran to the time limit, scoring {_number(cut_mean)} on "
            f"average against the sampled mean {_number(sampled_mean)}: an argmax policy that meets the same state "
            "twice repeats itself, where a sampled one breaks out; the sampled return is the policy as trained")


def _cut_episodes(truncated: object, per_env: int) -> int:
    """Episodes the time limit cut: each agent of a multi-agent env records one return per episode."""
    return -(-int(truncated.sum()) // per_env)


def _batch_progress(mode: str, episodes: int, per_env: int, started: float) -> object:
    """``evaluate_episodes``' progress callback: a line on stderr each time at least an eighth of the mode's
    episodes more have ended, and at the last one."""
    step = max(1, -(-episodes // 8))
    printed = [0]

    def progress(recorded: int, total: int) -> None:
        done = min(episodes, recorded // per_env)
        if done >= printed[0] + step or (done == episodes and printed[0] < episodes):
            printed[0] = done
            progress_line(f"eval: {mode} {done}/{episodes} episodes, {time.monotonic() - started:.1f} s")

    return progress
