"""steadyrl: on-policy RL trainers for language models that never lose or silently corrupt progress."""

from .reporting import quiet  # noqa: F401, I001  (first: it names DeepSpeed's accelerator before anything imports DeepSpeed)

from .callbacks import CheckpointCallback, GlobalStepCallback, GlobalStepError
from .checkpoint import CheckpointError
from .publish.hub import HubPushError
from .judges import JudgeError
from .rewards import RewardFunctionError
from .trainers.loop.dynamic_sampling import DynamicSamplingError
from .trainers import (
    ALGORITHMS,
    DistillationConfig,
    DistillationTrainer,
    GKDConfig,
    GKDTrainer,
    GRPOConfig,
    GRPOTrainer,
    OnlineDPOConfig,
    OnlineDPOTrainer,
    OnPolicyConfig,
    OnPolicyTrainer,
    PPOConfig,
    PPOTrainer,
    ReinforcePPConfig,
    ReinforcePPTrainer,
    RLOOConfig,
    RLOOTrainer,
)
from .version import __version__

__all__ = [
    "ALGORITHMS",
    "CheckpointCallback",
    "CheckpointError",
    "DynamicSamplingError",
    "GlobalStepCallback",
    "GlobalStepError",
    "DistillationConfig",
    "DistillationTrainer",
    "GKDConfig",
    "GKDTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "HubPushError",
    "JudgeError",
    "OnlineDPOConfig",
    "OnlineDPOTrainer",
    "OnPolicyConfig",
    "OnPolicyTrainer",
    "PPOConfig",
    "PPOTrainer",
    "ReinforcePPConfig",
    "ReinforcePPTrainer",
    "RLOOConfig",
    "RLOOTrainer",
    "RewardFunctionError",
    "__version__",
]
