"""One script for a GPU machine (under 5 minutes): the CUDA advantage kernel against the CPU one, its
speed at (T=128, N=16384) against a plain torch loop, and 60 s of PPO training on the Numba gridworld
on the GPU, printing steps/s.

    python benchmarks/gpu_check.py                 # on a CUDA machine
    python benchmarks/gpu_check.py --interpret     # no GPU: run the Triton kernel in Triton's CPU interpreter
    python benchmarks/gpu_check.py --train-seconds 60 --num-envs 4096
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line


def rollout(T: int, N: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return dict(
        values=rng.normal(size=(T, N)).astype(np.float32), rewards=rng.normal(size=(T, N)).astype(np.float32),
        terminals=rng.random((T, N)) < 0.02, truncations=rng.random((T, N)) < 0.02,
        final_values=rng.normal(size=(T, N)).astype(np.float32), next_value=rng.normal(size=N).astype(np.float32),
        masks=rng.random((T, N)) < 0.9, ratios=rng.uniform(0.2, 2.0, (T, N)).astype(np.float32))


def check_kernel(device: str, T: int, N: int) -> None:
    import torch

    from packrl.train.advantage import advantages_cuda, advantages_numba, reference_advantages

    kernel = advantages_cuda if device == "cuda" else _interpreted
    for masks in (False, True):
        for ratios in (False, True):
            data = rollout(T, N, seed=int(masks) * 2 + int(ratios))
            data["masks"] = data["masks"] if masks else None
            data["ratios"] = data["ratios"] if ratios else None
            params = dict(gamma=0.99, gae_lambda=0.95, rho_clip=1.0, c_clip=0.9)
            cpu = advantages_numba(**data, **params)
            tensors = {k: None if v is None else torch.from_numpy(v).to(device) for k, v in data.items()}
            gpu = kernel(**tensors, **params).cpu().numpy()
            ref = reference_advantages(**{k: None if v is None else v[..., :64] for k, v in data.items()}, **params)
            err_cpu, err_ref = float(np.abs(gpu - cpu).max()), float(np.abs(gpu[:, :64] - ref).max())
            ok = err_cpu < 1e-4 and err_ref < 1e-4
            print(f"kernel check T={T} N={N} masks={masks} ratios={ratios}: max |{device} - numba| {err_cpu:.2e}, "
                  f"max |{device} - float64 reference| {err_ref:.2e}  {'OK' if ok else 'MISMATCH'}")
            if not ok:
                raise SystemExit("CUDA advantage kernel disagrees with the CPU kernel")


def _interpreted(**kwargs):
    from packrl.train._triton_advantage import advantages_triton

    names = ("values", "rewards", "terminals", "truncations", "final_values", "next_value", "masks", "gamma",
             "gae_lambda", "ratios", "rho_clip", "c_clip")
    return advantages_triton(*(kwargs[n] for n in names))


def time_kernel(T: int, N: int, repeats: int) -> None:
    import torch

    from packrl.train.advantage import advantages_cuda, advantages_numba, advantages_torch

    data = rollout(T, N)
    tensors = {k: torch.from_numpy(v).cuda() for k, v in data.items()}
    rows = []
    for name, fn in (("triton kernel (cuda)", lambda: advantages_cuda(**tensors)),
                     ("torch loop over T (cuda)", lambda: advantages_torch(**tensors)),
                     ("numba kernel (cpu)", lambda: advantages_numba(**data))):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            tic = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - tic)
        rows.append((name, statistics.median(times)))
    base = rows[1][1]
    print(f"advantages T={T} N={N} (masks and ratios), median of {repeats}:")
    for name, t in rows:
        print(f"  {name:28} {t * 1e3:9.3f} ms   {base / t:7.1f}x vs torch loop")


def train(seconds: float, num_envs: int) -> None:
    import torch

    from packrl import vector
    from packrl.models import Policy
    from packrl.train.ppo import PPO, PPOConfig

    env = vector.make("gridworld", num_envs, backend="numba", seed=0)
    ppo = PPO(env, Policy.from_env(env, hidden=128), PPOConfig(num_steps=64, num_minibatches=4, update_epochs=2,
                                                               learning_rate=1e-3, device="cuda", bf16=True))
    start, history = time.perf_counter(), []

    def stop(stats: dict):
        history.append(stats)
        if len(history) % 10 == 0:
            print(f"  step {stats['global_step']:>11,}  sps {stats['sps']:>10,.0f}  "
                  f"return {stats.get('episode_return', float('nan')):.3f}", flush=True)
        return time.perf_counter() - start < seconds

    ppo.train(10**12, stop)
    elapsed = time.perf_counter() - start
    print(f"PPO on the Numba gridworld, {num_envs} envs, cuda + bf16: {ppo.global_step:,} agent steps in {elapsed:.0f} s "
          f"= {ppo.global_step / elapsed:,.0f} steps/s overall; last return "
          f"{next((h['episode_return'] for h in reversed(history) if 'episode_return' in h), float('nan')):.3f}; "
          f"{torch.cuda.get_device_name()}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interpret", action="store_true", help="no GPU: check the Triton kernel in its CPU interpreter")
    parser.add_argument("--train-seconds", type=float, default=60.0)
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is imported
    import torch

    print(machine_line())
    if args.interpret:
        check_kernel("cpu", T=33, N=300)
        return
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --interpret to check the kernel on CPU")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    check_kernel("cuda", T=128, N=4096)
    time_kernel(128, 16384, args.repeats)
    train(args.train_seconds, args.num_envs)


if __name__ == "__main__":
    main()
