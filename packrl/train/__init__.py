"""Training: PPO, advantages that know termination from truncation, and a replay buffer."""
from packrl.train.advantage import compute_advantages, reference_advantages
from packrl.train.ppo import PPO, PPOConfig
from packrl.train.replay import NStepBatch, ReplayBuffer, SequenceBatch

__all__ = ["NStepBatch", "PPO", "PPOConfig", "ReplayBuffer", "SequenceBatch", "compute_advantages", "reference_advantages"]
