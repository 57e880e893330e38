"""The overlapped rollout (``PPOConfig.overlap``, issue 27) against the synchronous one, side by side in one run:
``PPO.collect`` ms per rollout on packrl's Numba envs at several env counts, the two interleaved repeat by repeat,
and a check that both stored the same actions (the overlapped rollout is the same transitions in another order of
work). On CPU the overlapped envs step in a worker thread while this thread runs the policy; on CUDA this thread
steps them while the device runs the policy's graphs.

    python benchmarks/overlap.py [--envs cartpole,gridworld] [--num-envs 8,256,2048] [--repeats 5] [--device cpu]
    python benchmarks/overlap.py --device cuda --bf16 --num-envs 4096,16384 --repeats 3     # on a GPU
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, print_table

from packrl import vector
from packrl.models import Policy
from packrl.train.ppo import PPO, PPOConfig

STEPS = 64


def make(env_id: str, num_envs: int, overlap: bool, device: str, bf16: bool) -> PPO:
    env = vector.make(env_id, num_envs, backend="numba", seed=0, halves=overlap)
    torch.manual_seed(0)
    return PPO(env, Policy.from_env(env, hidden=128), PPOConfig(num_steps=STEPS, device=device, overlap=overlap,
                                                                bf16=bf16))


def collect_ms(ppo: PPO) -> float:
    if ppo.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    ppo.collect()
    if ppo.device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="cartpole,gridworld")
    parser.add_argument("--num-envs", default="8,256,2048")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (the GPU runs' setting)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_line())
    print(f"PPO.collect, {STEPS} steps per rollout, default policy (hidden 128), median of {args.repeats} rollouts "
          f"after one warm-up, the two interleaved; device {args.device}{', bf16' if args.bf16 else ''}, 1 torch thread")
    rows = []
    for env_id in args.envs.split(","):
        for n in (int(v) for v in args.num_envs.split(",")):
            runs = {overlap: make(env_id, n, overlap, args.device, args.bf16) for overlap in (False, True)}
            times: dict[bool, list[float]] = {False: [], True: []}
            for ppo in runs.values():  # warm-up (compilation, allocation, graph capture on CUDA) from one seed each
                torch.manual_seed(0)
                ppo.collect()
            same = torch.equal(runs[False].actions, runs[True].actions)
            for _ in range(args.repeats):
                for overlap, ppo in runs.items():
                    times[overlap].append(collect_ms(ppo))
            sync, over = (statistics.median(times[o]) for o in (False, True))
            for ppo in runs.values():
                ppo.driver.close()
                ppo.env.close()
            rows.append([env_id, f"{n:,}", str(same), f"{sync:.1f}", f"{over:.1f}", f"{sync / over:.2f}x",
                         f"{n * STEPS / sync:,.1f}k", f"{n * STEPS / over:,.1f}k"])
    print_table("synchronous against overlapped rollout", ["env", "envs", "same actions", "sync ms", "overlap ms", "speed-up",
                                                           "sync steps/s", "overlap steps/s"], rows)


if __name__ == "__main__":
    main()
