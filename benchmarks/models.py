"""Layout encoder vs a float-cast MLP baseline on a NetHack-like Dict, side by side.

Both policies share the same MLP network and decoder; only the encoder differs:
- baseline: the packed uint8 rows cast to float32 and fed to Linear + ReLU (what ``torch.Tensor(obs)``
  users do; it reads bytes, not leaves);
- layout: ``LayoutEncoder`` (nativize, per-leaf scaling, one projection).
Measured: ``forward_eval`` latency at batch 1 and 1024 (no grad), and training forward + backward
throughput over ``(64, 16)`` rows. CPU always; CUDA too when present (same script).

    .venv/bin/python benchmarks/models.py [--compile] [--repeats 7]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import NETHACK, machine_line, per_call_us, print_table

from packrl.emulation import Layout
from packrl.models import MLP, Decoder, LayoutEncoder, Policy
from packrl.models.heads import layer_init

HIDDEN = 128
ACTIONS = spaces.Discrete(23)


class FloatCastEncoder(nn.Module):
    """The baseline: bytes as floats, one Linear + ReLU."""

    def __init__(self, nbytes: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(layer_init(nn.Linear(nbytes, hidden)), nn.ReLU())
        self.output_size = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.float())


def build(kind: str, layout: Layout) -> Policy:
    encoder = LayoutEncoder(layout, HIDDEN) if kind == "layout" else FloatCastEncoder(layout.nbytes, HIDDEN)
    return Policy(encoder, MLP(HIDDEN, HIDDEN), Decoder(ACTIONS, HIDDEN))


def rows(layout: Layout, n: int, seed: int = 0) -> np.ndarray:
    NETHACK.seed(seed)
    return layout.pack_batch([NETHACK.sample() for _ in range(min(n, 64))])[np.arange(n) % min(n, 64)]


def measure(device: str, compile_: bool, repeats: int) -> list[list[object]]:
    layout = Layout.from_space(NETHACK)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    data = torch.from_numpy(rows(layout, 1024)).to(device)
    out: list[list[object]] = []
    base: dict[str, float] = {}
    for kind in ("baseline", "layout"):
        torch.manual_seed(0)
        policy = build(kind, layout).to(device)
        optim = torch.optim.Adam(policy.parameters(), lr=1e-4)
        step = torch.compile(policy.forward_eval) if compile_ else policy.forward_eval
        train = torch.compile(policy.forward) if compile_ else policy.forward

        for batch in (1, 1024):
            x = data[:batch]

            def evaluate() -> None:
                with torch.no_grad():
                    step(x, ())
                sync()

            evaluate()
            us, spread = per_call_us(evaluate, repeats)
            key = f"eval{batch}"
            base.setdefault(key, us)
            out.append([device, kind, f"forward_eval, batch {batch}", us, spread, us / base[key], batch / us * 1e6])

        seq = data.reshape(64, 16, -1)

        def train_step() -> None:
            logits, values, _ = train(seq, ())
            dist = policy.distribution(logits)
            loss = -dist.log_prob(dist.mode()).mean() + values.pow(2).mean()
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            sync()

        train_step()
        us, spread = per_call_us(train_step, repeats)
        base.setdefault("train", us)
        out.append([device, kind, "train fwd+bwd, 64x16", us, spread, us / base["train"], 1024 / us * 1e6])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="torch.compile forward_eval and forward (slow to build)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    layout = Layout.from_space(NETHACK)
    print(machine_line())
    print(f"NetHack-like Dict: {len(layout.leaves)} leaves, {layout.nbytes} bytes per row; hidden {HIDDEN}; "
          f"torch threads {torch.get_num_threads()}; compiled: {args.compile}")
    results = measure("cpu", args.compile, args.repeats)
    if torch.cuda.is_available():
        results += measure("cuda", args.compile, args.repeats)
    print_table("Layout encoder vs float-cast MLP (median of repeats; ratio = time / baseline time, lower is faster)",
                ["device", "encoder", "case", "median us/call", "spread us", "ratio", "rows/s"], results)


if __name__ == "__main__":
    main()
