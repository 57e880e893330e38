"""Frames and wall time to threshold on MiniGrid: `packrl train ENV`'s defaults against torch-ac with
rl-starter-files' published settings.

Tasks (rl-starter-files' README commands): MiniGrid-DoorKey-5x5-v0 (`--frames 80000`), MiniGrid-GoToDoor-5x5-v0
with the mission text (`--text --frames 1000000`), MiniGrid-RedBlueDoors-6x6-v0 with memory (`--recurrence 4
--frames 1000000`); issue 30's: DoorKey-6x6 (100k frames), Fetch-5x5-N2 (300k, its target named only in the
mission), and Unlock, LavaGapS5, BabyAI GoToRedBallGrey (150k each). The threshold is met at the first iteration
(torch-ac: update) whose last 100 finished training episodes average it; the run stops there (or at the frame
budget).

packrl runs what `packrl train ENV --seed S` trains: the config from `packrl.config.resolve` (defaults < the
env id's preset), built by `packrl.train.run.build_ppo`. torch-ac (PyPI `torch-ac`) runs its PPOAlgo with
rl-starter-files' `scripts/train.py` defaults: 16 processes (torch-ac's ParallelEnv: one env in this process,
15 in forked workers), 128 frames per process, lr 1e-3, Adam eps 1e-8, 4 epochs, batch 256, discount 0.99,
GAE lambda 0.95, clip 0.2, entropy 0.01, value loss 0.5, max grad norm 0.5, recurrence 1 (4 with memory),
env i reset with seed + 10000 i. Its model, `StarterModel`, is written here from rl-starter-files' published
ACModel (model.py): the 2x2-conv image trunk on the raw 7x7x3 codes, an LSTMCell(64) memory when recurrence
> 1, word embeddings (32) and a GRU (128) over the mission when `--text`, tanh actor and critic MLPs of 64,
rows of each Linear weight drawn normal and scaled to unit norm. Every contender uses one torch thread in
its main process and runs alone, one after the other.

    flock /tmp/cpu.lock .venv/bin/python benchmarks/learning_minigrid.py [--tasks doorkey] [--seeds 3]
        [--contenders packrl,torch-ac] [--set policy.network=lstm]
"""
from __future__ import annotations

import argparse
import multiprocessing
import re
import statistics
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from common import machine_line, print_table, record_returns, setting_changes, summary
from torch import nn

THRESHOLD = 0.9
WINDOW = 100  # finished training episodes in the moving mean

TASKS = {  # name: (env id, frame budget, rl-starter-files' text and memory flags)
    "doorkey": ("MiniGrid-DoorKey-5x5-v0", 200_000, {"text": False, "recurrence": 1}),
    "gotodoor": ("MiniGrid-GoToDoor-5x5-v0", 1_000_000, {"text": True, "recurrence": 1}),
    "redbluedoors": ("MiniGrid-RedBlueDoors-6x6-v0", 1_000_000, {"text": False, "recurrence": 4}),
    # issue 30's targets: DoorKey-6x6 within 100k frames, Fetch (the target named only in the mission) within 300k
    "doorkey6": ("MiniGrid-DoorKey-6x6-v0", 100_000, {"text": False, "recurrence": 1}),
    "fetch": ("MiniGrid-Fetch-5x5-N2-v0", 300_000, {"text": True, "recurrence": 1}),
    # the other tasks issue 30 saw learn with defaults (0.85-0.9 within 30k-90k frames): kept learning
    "unlock": ("MiniGrid-Unlock-v0", 150_000, {"text": False, "recurrence": 1}),
    "lavagap": ("MiniGrid-LavaGapS5-v0", 150_000, {"text": False, "recurrence": 1}),
    "gotoredballgrey": ("BabyAI-GoToRedBallGrey-v0", 150_000, {"text": True, "recurrence": 1}),
}


@dataclass
class Result:
    frames: int | None  # frames when the threshold was first met (None: not within the budget)
    seconds: float | None
    last_mean: float  # moving mean when the run stopped
    total_frames: int
    total_seconds: float


class Window:
    """The last WINDOW finished episodes' returns, and the first time their mean reached THRESHOLD."""

    log_every = 0  # print the moving mean every this many iterations (--log-every; 0: never)

    def __init__(self, start: float):
        self.returns: deque = deque(maxlen=WINDOW)
        self.start, self.hit, self.iterations = start, None, 0

    def add(self, returns, frames: int) -> bool:
        """Record an iteration's finished episodes; True once the threshold is met."""
        self.returns.extend(returns)
        self.iterations += 1
        if self.log_every and self.iterations % self.log_every == 0 and self.returns:
            print(f"      {frames:,} frames, {time.perf_counter() - self.start:.0f} s: moving mean "
                  f"{np.mean(self.returns):.3f}", flush=True)
        if self.hit is None and len(self.returns) == WINDOW and np.mean(self.returns) >= THRESHOLD:
            self.hit = (frames, time.perf_counter() - self.start)
        return self.hit is not None

    def result(self, frames: int) -> Result:
        hit = self.hit or (None, None)
        mean = float(np.mean(self.returns)) if self.returns else float("nan")
        return Result(hit[0], hit[1], mean, frames, time.perf_counter() - self.start)


# ---------------------------------------------------------------- packrl


def packrl_run(env_id: str, seed: int, budget: int, changes: dict) -> Result:
    """`packrl train ENV_ID --seed SEED --total-steps BUDGET` (plus ``changes``), stopped at the threshold."""
    from packrl import config as settings
    from packrl.train.run import build_ppo

    flags = {"env": {"id": env_id}, "train": {"seed": seed, "total_steps": budget}}
    for section, values in changes.items():
        flags.setdefault(section, {}).update(values)
    config, preset = settings.resolve(flags=flags)
    window = Window(time.perf_counter())
    ppo = build_ppo(config)
    finished: list = []

    record_returns(ppo, finished.extend)

    def callback(stats: dict) -> bool:
        solved = window.add(finished, stats["global_step"])
        finished.clear()
        return not solved  # False stops the run

    history = ppo.train(budget, callback)
    ppo.env.close()
    rollout, update = (sum(h[k] for h in history) for k in ("rollout_seconds", "update_seconds"))
    print(f"    packrl {env_id} seed {seed} (preset {preset and preset.name}, network {config['policy']['network']}): "
          f"{len(history)} iterations, rollouts {rollout:.1f} s, updates {update:.1f} s", flush=True)
    return window.result(ppo.global_step)


# ---------------------------------------------------------------- torch-ac


class StarterModel(nn.Module):
    """rl-starter-files' ACModel, from its published architecture (see the module docstring)."""

    def __init__(self, num_actions: int, use_memory: bool, use_text: bool, vocab: int = 100):
        super().__init__()
        self.use_memory, self.use_text = use_memory, use_text
        self.recurrent = use_memory  # torch-ac reads this attribute
        self.image_conv = nn.Sequential(
            nn.Conv2d(3, 16, (2, 2)), nn.ReLU(), nn.MaxPool2d((2, 2)),
            nn.Conv2d(16, 32, (2, 2)), nn.ReLU(),
            nn.Conv2d(32, 64, (2, 2)), nn.ReLU())
        self.image_embedding_size = 64  # 7x7 view: ((7 - 1) // 2 - 2) ** 2 * 64
        if use_memory:
            self.memory_rnn = nn.LSTMCell(self.image_embedding_size, self.image_embedding_size)
        embedding_size = self.image_embedding_size
        if use_text:
            self.word_embedding = nn.Embedding(vocab, 32)
            self.text_rnn = nn.GRU(32, 128, batch_first=True)
            embedding_size += 128
        self.actor = nn.Sequential(nn.Linear(embedding_size, 64), nn.Tanh(), nn.Linear(64, num_actions))
        self.critic = nn.Sequential(nn.Linear(embedding_size, 64), nn.Tanh(), nn.Linear(64, 1))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.data.normal_(0, 1)
                module.weight.data *= 1 / torch.sqrt(module.weight.data.pow(2).sum(1, keepdim=True))
                module.bias.data.fill_(0)

    @property
    def memory_size(self) -> int:
        return 2 * self.image_embedding_size

    def forward(self, obs, memory=None):
        x = self.image_conv(obs.image.transpose(1, 3).transpose(2, 3)).reshape(obs.image.shape[0], -1)
        if self.use_memory:
            hidden = (memory[:, :self.image_embedding_size], memory[:, self.image_embedding_size:])
            hidden = self.memory_rnn(x, hidden)
            embedding, memory = hidden[0], torch.cat(hidden, dim=1)
        else:
            embedding = x
        if self.use_text:
            _, hidden = self.text_rnn(self.word_embedding(obs.text))
            embedding = torch.cat((embedding, hidden[-1]), dim=1)
        dist = torch.distributions.Categorical(logits=torch.log_softmax(self.actor(embedding), dim=1))
        value = self.critic(embedding).squeeze(1)
        return (dist, value, memory) if self.use_memory else (dist, value)


class Preprocessor:
    """rl-starter-files' obs preprocessing: the image as float codes, the mission as word indices (words are
    lowercase ``[a-z]+`` runs, numbered as first seen, at most 100), padded with 0."""

    def __init__(self, max_size: int = 100):
        self.vocab: dict[str, int] = {}
        self.max_size = max_size

    def __call__(self, obss, device=None):
        from torch_ac import DictList

        image = torch.tensor(np.array([o["image"] for o in obss]), device=device, dtype=torch.float)
        tokens = [[self._index(w) for w in re.findall("([a-z]+)", o["mission"].lower())] for o in obss]
        text = np.zeros((len(tokens), max(map(len, tokens))), np.int64)
        for i, t in enumerate(tokens):
            text[i, :len(t)] = t
        return DictList({"image": image, "text": torch.tensor(text, device=device)})

    def _index(self, word: str) -> int:
        if word not in self.vocab:
            if len(self.vocab) >= self.max_size - 1:
                raise ValueError("rl-starter-files' vocabulary is full (100 words)")
            self.vocab[word] = len(self.vocab) + 1
        return self.vocab[word]


def torch_ac_run(env_id: str, seed: int, budget: int, flags: dict) -> Result:
    """rl-starter-files' `scripts.train --algo ppo --env ENV_ID --seed SEED` with the task's flags."""
    import gymnasium
    import minigrid  # noqa: F401  (registers the ids)
    import torch_ac

    torch.manual_seed(seed)
    np.random.seed(seed)
    envs = []
    for i in range(16):
        env = gymnasium.make(env_id)
        env.reset(seed=seed + 10000 * i)
        envs.append(env)
    model = StarterModel(envs[0].action_space.n, flags["recurrence"] > 1, flags["text"])
    window = Window(time.perf_counter())
    algo = torch_ac.PPOAlgo(envs, model, torch.device("cpu"), 128, 0.99, 0.001, 0.95, 0.01, 0.5, 0.5,
                            flags["recurrence"], 1e-8, 0.2, 4, 256, Preprocessor())
    frames = 0
    while frames < budget:
        exps, logs = algo.collect_experiences()
        ended = int((algo.masks[1:] == 0).sum() + (algo.mask == 0).sum())  # episodes ended in this update
        algo.update_parameters(exps)
        frames += logs["num_frames"]
        if window.add(logs["return_per_episode"][-ended:] if ended else [], frames):
            break
    for worker in multiprocessing.active_children():  # ParallelEnv's forked workers wait on their pipes forever
        worker.terminate()
        worker.join()
    return window.result(frames)


# ---------------------------------------------------------------- report



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="doorkey", help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--contenders", default="packrl,torch-ac")
    parser.add_argument("--budget", type=int, help="frame budget (default: the task's)")
    parser.add_argument("--log-every", type=int, default=0, help="print the moving mean every N iterations")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting on top of packrl's preset (a sweep), e.g. policy.network=lstm")
    args = parser.parse_args()
    changes = setting_changes(args.set)
    torch.set_num_threads(1)
    Window.log_every = args.log_every
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(machine_line(("minigrid", "torch-ac")))
    print(f"torch threads: 1 in each contender's main process; threshold: the moving mean of the last {WINDOW} "
          f"finished training episodes >= {THRESHOLD}; runs stop there or at the budget\n", flush=True)
    rows, medians = [], {}
    for task in args.tasks.split(","):
        env_id, budget, flags = TASKS[task]
        budget = args.budget or budget
        for contender in args.contenders.split(","):
            results = []
            for seed in seeds:
                if contender == "packrl":
                    r = packrl_run(env_id, seed, budget, changes)
                else:
                    r = torch_ac_run(env_id, seed, budget, flags)
                seconds = r.seconds and round(r.seconds, 1)
                print(f"  {contender} {task} seed {seed}: frames {r.frames}, seconds {seconds}, moving mean "
                      f"{r.last_mean:.3f} at {r.total_frames:,} frames, {r.total_seconds:.1f} s", flush=True)
                results.append(r)
            solved = sum(r.frames is not None for r in results)
            times = [r.seconds for r in results if r.seconds is not None]
            medians[task, contender] = statistics.median(times) if times else float("nan")
            name = contender + ("".join(f" {s}" for s in args.set) if contender == "packrl" else "")
            rows.append([f"{name}, {task}", f">= {THRESHOLD} in {budget:,}", f"{solved}/{len(results)}",
                         summary([r.frames for r in results]), summary([r.seconds for r in results]),
                         summary([r.last_mean for r in results])])
    print_table("Frames and seconds to threshold: median [min-max]", ["contender", "threshold", "solved", "frames",
                "seconds", "final moving mean"], rows)
    for task in args.tasks.split(","):
        ours, theirs = medians.get((task, "packrl")), medians.get((task, "torch-ac"))
        if ours and theirs and np.isfinite(ours) and np.isfinite(theirs):
            print(f"wall to threshold, {task}, packrl / torch-ac: {ours / theirs:.2f}x (median / median)")


if __name__ == "__main__":
    main()
