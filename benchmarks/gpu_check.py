"""One script for a GPU machine (issue 27's numbers, a few minutes): the CUDA advantage kernel against the CPU one
and a torch loop at (T=128, N=16384); the PPO split on the Numba gridworld at 4096, 16384 and 65536 envs and on
Numba CartPole at the first two (env-only steps/s, collect and update ms per iteration, end-to-end agent steps/s with
the profiler off, the device-busy share of one profiled collect and its launches per step, whether the rollout ran
as CUDA graphs); then a learning run on the gridworld: agent steps to a mean return of 1.25 (optimum about 1.30).

    python benchmarks/gpu_check.py                 # on a CUDA machine
    python benchmarks/gpu_check.py --interpret     # no GPU: run the Triton kernel in Triton's CPU interpreter
    python benchmarks/gpu_check.py --device cpu --split-envs 64,256 --num-envs 64 --train-seconds 10   # the script on CPU
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


def env_only_rate(env_id: str, num_envs: int, seconds: float = 2.0) -> float:
    """Agent steps/s of the Numba envs alone, stepping random actions drawn once."""
    from packrl import vector

    env = vector.make(env_id, num_envs, backend="numba", seed=0)
    env.reset(seed=0)
    actions = np.stack([env.single_action_space.sample() for _ in range(num_envs)])
    env.step(actions)
    steps, tic = 0, time.perf_counter()
    while time.perf_counter() - tic < seconds:
        env.step(actions)
        steps += env.num_agents
    rate = steps / (time.perf_counter() - tic)
    env.close()
    return rate


def _device_time_us(event) -> float:
    """An event's own device time in µs, under the attribute name this torch version uses."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def profile_collect(ppo, sync) -> tuple[float, float, dict]:
    """(device-busy share of one collect: kernel time over wall, launches per step, top host calls) under
    torch.profiler. Launches count cudaLaunchKernel, cudaGraphLaunch and cudaMemcpyAsync calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    with profile(activities=activities) as prof:
        tic = time.perf_counter()
        ppo.collect()
        sync()
        wall = time.perf_counter() - tic
    averages = prof.key_averages()
    busy_us = sum(_device_time_us(e) for e in averages if getattr(e, "device_type", None) is not None
                  and "CUDA" in str(e.device_type))
    launches = sum(e.count for e in averages if e.key in ("cudaLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
                                                          "cuLaunchKernel", "cudaLaunchKernelExC"))
    return busy_us * 1e-6 / wall, launches / ppo.config.num_steps, {e.key: e.count for e in averages}


def default_ppo(env, device: str, bf16: bool, graphs: bool = False):
    """PPO as every row of this script runs it: the default policy (hidden 128), 64 steps, 2 epochs x 4 minibatches;
    ``graphs``: the rollout as CUDA graphs (``cuda_graphs``, opt-in until this script shows it at least as fast)."""
    from packrl.models import Policy
    from packrl.train.ppo import PPO, PPOConfig

    return PPO(env, Policy.from_env(env, hidden=128), PPOConfig(num_steps=64, num_minibatches=4, update_epochs=2,
                                                                learning_rate=1e-3, device=device, bf16=bf16,
                                                                cuda_graphs=graphs))


def split(env_id: str, num_envs: int, device: str, iterations: int, bf16: bool, graphs: bool = False) -> dict:
    """One PPO configuration's split: env-only rate, collect and update ms per iteration (median), end-to-end agent
    steps/s (profiler off), then one profiled collect: device-busy share and launches per step."""
    import torch

    from packrl import vector

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    env = vector.make(env_id, num_envs, backend="numba", seed=0)
    ppo = default_ppo(env, device, bf16, graphs)
    ppo.collect()  # the first iteration captures the rollout's CUDA graphs (with graphs)
    ppo.update()
    sync()
    collects, updates, steps, tic = [], [], 0, time.perf_counter()
    for _ in range(iterations):
        t0 = time.perf_counter()
        steps += ppo.collect()["agent_steps"]
        sync()
        t1 = time.perf_counter()
        ppo.update()
        sync()
        collects.append(t1 - t0)
        updates.append(time.perf_counter() - t1)
    rate = steps / (time.perf_counter() - tic)
    busy, launches, _ = profile_collect(ppo, sync)
    graphs = ppo.graphs.captured
    env.close()
    return {"env": env_id, "num_envs": num_envs, "env_only": env_only_rate(env_id, num_envs), "collect_ms":
            statistics.median(collects) * 1e3, "update_ms": statistics.median(updates) * 1e3, "sps": rate,
            "busy": busy, "launches": launches, "graphs": graphs}


def print_splits(rows: list[dict], device: str) -> None:
    print(f"PPO split on {device} (64 steps x num_envs per iteration, 2 epochs x 4 minibatches, hidden 128, default "
          "policy; steps/s with the profiler off, busy share and launches from one profiled collect):")
    print(f"  {'env':10} {'envs':>6} {'env-only steps/s':>17} {'collect ms':>11} {'update ms':>10} {'PPO steps/s':>12} "
          f"{'busy':>6} {'launches/step':>14} {'graphs':>7}")
    for r in rows:
        print(f"  {r['env']:10} {r['num_envs']:>6} {r['env_only']:>17,.0f} {r['collect_ms']:>11.1f} {r['update_ms']:>10.1f} "
              f"{r['sps']:>12,.0f} {r['busy']:>6.1%} {r['launches']:>14.1f} {str(r['graphs']):>7}")


def learn(seconds: float, num_envs: int, device: str, bf16: bool, target: float = 1.25) -> None:
    """PPO on the Numba gridworld until the time runs out: agent steps to first reach a mean return of ``target``
    (the optimum is about 1.30), and the return at the end."""
    import torch

    from packrl import vector

    env = vector.make("gridworld", num_envs, backend="numba", seed=0)
    ppo = default_ppo(env, device, bf16)
    start, history, reached = time.perf_counter(), [], []

    def stop(stats: dict):
        history.append(stats)
        if not reached and stats.get("episode_return", 0.0) >= target:
            reached.append((stats["global_step"], time.perf_counter() - start))
        if len(history) % 10 == 0:
            print(f"  step {stats['global_step']:>11,}  sps {stats['sps']:>10,.0f}  "
                  f"return {stats.get('episode_return', float('nan')):.3f}", flush=True)
        return time.perf_counter() - start < seconds

    ppo.train(10**12, stop)
    elapsed = time.perf_counter() - start
    last = next((h["episode_return"] for h in reversed(history) if "episode_return" in h), float("nan"))
    where = f"{reached[0][0]:,} agent steps ({reached[0][1]:.1f} s)" if reached else "not reached"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"PPO on the Numba gridworld, {num_envs} envs, {device}{' + bf16' if bf16 else ''}: {ppo.global_step:,} agent "
          f"steps in {elapsed:.0f} s = {ppo.global_step / elapsed:,.0f} steps/s overall; return >= {target} at {where}; "
          f"last return {last:.3f}; {name}")
    env.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interpret", action="store_true", help="no GPU: check the Triton kernel in its CPU interpreter")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the split and learning run on "
                        "the CPU (small env counts), to check the script without a GPU")
    parser.add_argument("--train-seconds", type=float, default=60.0)
    parser.add_argument("--num-envs", type=int, default=4096, help="envs of the learning run")
    parser.add_argument("--split-envs", default="4096,16384,65536", help="env counts of the split table (comma list)")
    parser.add_argument("--split-iterations", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    try:
        split_envs = [int(n) for n in args.split_envs.split(",")]
    except ValueError:
        parser.error(f"--split-envs: a comma list of env counts, not {args.split_envs!r}")
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton is imported
    import torch

    print(machine_line())
    if args.interpret:
        check_kernel("cpu", T=33, N=300)
        return
    cuda = args.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # as packrl train on CPU: a second thread on a shared 2-core machine only waits
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --device cpu / --interpret")
    if cuda:
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
        check_kernel("cuda", T=128, N=4096)
        time_kernel(128, 16384, args.repeats)
    # eager and graph rollouts side by side (the graphs stay opt-in until they are at least as fast here)
    modes = (False, True) if cuda else (False,)
    rows = [split("gridworld", n, args.device, args.split_iterations, cuda, g) for n in split_envs for g in modes]
    rows += [split("cartpole", n, args.device, args.split_iterations, cuda, g) for n in split_envs[:2] for g in modes]
    print_splits(rows, args.device)
    learn(args.train_seconds, args.num_envs, args.device, bf16=cuda)


if __name__ == "__main__":
    main()
