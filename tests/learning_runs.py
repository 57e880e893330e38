"""Training runs that the learning tests share: ``packrl train ENV``'s config, trained until a moving mean of the
finished training episodes meets a threshold."""
from collections import deque

import numpy as np

from packrl import config as settings
from packrl.train.ppo import EpisodeTracker
from packrl.train.run import build_ppo


def frames_to_mean(env_id: str, threshold: float, budget: int, seed: int = 0,
                   window: int = 100) -> tuple[int | None, str]:
    """Train with ``env_id``'s defaults until the last ``window`` finished training episodes average
    ``threshold``: ``(frames then, or None within budget, the preset's name)``."""
    config, preset = settings.resolve(flags={"env": {"id": env_id}, "train": {"seed": seed, "total_steps": budget}})
    ppo = build_ppo(config)
    returns: deque = deque(maxlen=window)

    class Recording(EpisodeTracker):
        def pop(self) -> dict:
            returns.extend(r for r, _, _ in self.finished)
            return super().pop()

    ppo.episodes = Recording(ppo.num_rows, ppo.episodes.agents)
    hit: list = []

    def stop_at_threshold(stats: dict) -> bool:
        if len(returns) == window and np.mean(returns) >= threshold:
            hit.append(stats["global_step"])
        return not hit

    ppo.train(budget, stop_at_threshold)
    ppo.env.close()
    return (hit[0] if hit else None), preset.name


def best_of_seeds(env_id: str, threshold: float, budget: int, seeds: tuple[int, ...], preset: str,
                  window: int = 100) -> tuple[int, int]:
    """``frames_to_mean`` on each of ``seeds`` in turn until one meets ``threshold`` within ``budget``: ``(that
    seed, its frames)``. A learning test that rests on one seed's trajectory fails as soon as the CPU's kernels
    move it (issue 42); the best of a few seeds holds, and benchmarks/ records the spread. Every run must get
    ``preset``. AssertionError naming the seeds when none meets it."""
    for seed in seeds:
        frames, name = frames_to_mean(env_id, threshold, budget, seed=seed, window=window)
        assert name == preset, f"{env_id} got preset {name}, not {preset}"
        if frames is not None:
            return seed, frames
    raise AssertionError(f"{env_id}: the moving mean of {window} training episodes never reached {threshold} within "
                         f"{budget:,} steps on seeds {list(seeds)}")
