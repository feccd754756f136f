"""The shared on-policy loop and one small file per algorithm."""

from .config import OnPolicyConfig
from .on_policy import OnPolicyTrainer
from .online_dpo import OnlineDPOConfig, OnlineDPOTrainer
from .ppo import PPOConfig, PPOTrainer
from .rloo import RLOOConfig, RLOOTrainer

__all__ = [
    "OnPolicyConfig",
    "OnPolicyTrainer",
    "OnlineDPOConfig",
    "OnlineDPOTrainer",
    "PPOConfig",
    "PPOTrainer",
    "RLOOConfig",
    "RLOOTrainer",
]
