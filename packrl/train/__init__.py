"""Training: PPO, advantages that know termination from truncation, and a replay buffer."""
from packrl.train.advantage import compute_advantages, reference_advantages

__all__ = ["compute_advantages", "reference_advantages"]
