"""The optimizer step around one PPO minibatch, per call: zero the gradients, clip them, Adam step.

Contenders, on the parameters of packrl's default CartPole policy (hidden 64) with fixed gradients:
- torch: ``torch.optim.Adam(fused=True)`` with ``zero_grad()`` and ``nn.utils.clip_grad_norm_`` (CleanRL's calls);
- TorchAdam: packrl's fallback (torch.optim.Adam, fused, with the written-out clipping);
- FlatAdam: packrl's default (one flat parameter buffer and one flat gradient buffer).
Interleaved rounds (A, B, C, A, B, C, ...) of ``--calls`` calls each; medians of CPU time per call.

    flock /tmp/cpu.lock .venv/bin/python benchmarks/optimizer.py [--rounds 15] [--calls 500] [--hidden 64]
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from common import machine_line, print_table


def _policy(hidden: int) -> torch.nn.Module:
    from packrl import vector
    from packrl.models import Policy

    env = vector.make("cartpole", 2, backend="numba")
    torch.manual_seed(0)
    policy = Policy.from_env(env, hidden=hidden)
    env.close()
    return policy


def contenders(hidden: int) -> dict:
    from packrl.train.optimizer import FlatAdam, TorchAdam

    def make(kind: str) -> Callable[[], None]:
        params = list(_policy(hidden).parameters())
        grads = [torch.randn_like(p) for p in params]
        if kind == "FlatAdam":
            opt = FlatAdam(params, 1e-3)

            def call() -> None:
                opt.zero_grad()
                for p, g in zip(params, grads):  # what backward's accumulation writes
                    p.grad.add_(g)
                opt.clip_grad_norm(0.5)
                opt.step()
            return call
        opt = TorchAdam(params, 1e-3) if kind == "TorchAdam" else torch.optim.Adam(params, 1e-3, eps=1e-5, fused=True)

        def call() -> None:
            opt.zero_grad()
            for p, g in zip(params, grads):
                p.grad = g.clone()  # backward's first accumulation hands a new tensor over
            if kind == "TorchAdam":
                opt.clip_grad_norm(0.5)
            else:
                torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
        return call

    return {kind: make(kind) for kind in ("torch", "TorchAdam", "FlatAdam")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    calls = contenders(args.hidden)
    times: dict[str, list[float]] = {k: [] for k in calls}
    for call in calls.values():
        for _ in range(50):
            call()
    for _ in range(args.rounds):
        for name, call in calls.items():
            start = time.process_time()
            for _ in range(args.calls):
                call()
            times[name].append((time.process_time() - start) / args.calls * 1e6)
    print(machine_line())
    base = statistics.median(times["torch"])
    rows = [[name, f"{statistics.median(t):.1f}", f"{min(t):.1f}-{max(t):.1f}", f"{statistics.median(t) / base:.2f}x"]
            for name, t in times.items()]
    print_table(f"zero + clip + Adam step per call, default CartPole policy (hidden {args.hidden}), CPU us, "
                f"{args.rounds} interleaved rounds of {args.calls}", ["contender", "median us", "range", "vs torch"], rows)


if __name__ == "__main__":
    main()
