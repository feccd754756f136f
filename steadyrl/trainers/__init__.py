"""The shared on-policy loop and one small file per algorithm."""

from .config import OnPolicyConfig
from .on_policy import OnPolicyTrainer
from .rloo import RLOOConfig, RLOOTrainer

__all__ = ["OnPolicyConfig", "OnPolicyTrainer", "RLOOConfig", "RLOOTrainer"]
