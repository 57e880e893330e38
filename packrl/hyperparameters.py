"""PPO's hyperparameters as plain data, below both the trainer (``packrl.train.ppo``, which re-exports them) and
the settings schema (``packrl.config``, which reads their fields): neither package imports the other for them, and
reading them imports no torch (``packrl train --help`` stays fast).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["PPOConfig"]


@dataclass
class PPOConfig:
    """Hyperparameters, with CleanRL's names and defaults (Atari/CartPole PPO)."""

    num_steps: int = 128  # rollout length per row
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    vtrace: bool = False  # importance-clip the advantages (rho/c) with the current policy each epoch
    rho_clip: float = 1.0
    c_clip: float = 1.0
    normalize_rewards: bool = False  # rewards / running std of the discounted return, clipped to +-10 (reward_scaling.py)
    bootstrap_truncation: bool = True  # False ORs truncation into termination (the common bug), for ablations
    bptt_horizon: int | None = None  # recurrent segment length (default: num_steps)
    bf16: bool = False  # bfloat16 autocast for forward passes
    cuda_graphs: bool = False  # on CUDA, each rollout step replayed as a captured CUDA graph (opt-in until shown on a GPU)
    overlap: bool = False  # step one half of the envs while the policy runs for the other (envs made in halves)
    compile: bool = False  # torch.compile the minibatch loss (and the rollout forward off CPU); seconds to compile
    seed: int = 0
    device: str = "auto"  # "auto": cuda when present, else cpu

    def resolve_device(self) -> "torch.device":
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)
