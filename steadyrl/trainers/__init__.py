"""The shared on-policy loop, one small file per algorithm, and ``ALGORITHMS``: the registry of them all.

Adding an algorithm is one file (its config and trainer) plus one line in ``ALGORITHMS``; the command line
(``steadyrl <name>``), the demo, the examples, the tests and the benchmarks find it there.
"""

from typing import NamedTuple

from .config.on_policy_config import OnPolicyConfig
from .distillation import DistillationConfig, DistillationTrainer
from .gkd import GKDConfig, GKDTrainer
from .grpo import GRPOConfig, GRPOTrainer
from .loop.on_policy import OnPolicyTrainer
from .online_dpo import OnlineDPOConfig, OnlineDPOTrainer
from .ppo import PPOConfig, PPOTrainer
from .reinforce_pp import ReinforcePPConfig, ReinforcePPTrainer
from .rloo import RLOOConfig, RLOOTrainer


class Algorithm(NamedTuple):
    config_class: type[OnPolicyConfig]
    trainer_class: type[OnPolicyTrainer]


# name (as in ``steadyrl <name>`` and the trainer's ``algorithm_name``) -> its config and trainer classes
ALGORITHMS: dict[str, Algorithm] = {
    "rloo": Algorithm(RLOOConfig, RLOOTrainer),
    "grpo": Algorithm(GRPOConfig, GRPOTrainer),
    "ppo": Algorithm(PPOConfig, PPOTrainer),
    "online-dpo": Algorithm(OnlineDPOConfig, OnlineDPOTrainer),
    "distillation": Algorithm(DistillationConfig, DistillationTrainer),
    "gkd": Algorithm(GKDConfig, GKDTrainer),
    "reinforce-pp": Algorithm(ReinforcePPConfig, ReinforcePPTrainer),
}

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "DistillationConfig",
    "DistillationTrainer",
    "GKDConfig",
    "GKDTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "OnPolicyConfig",
    "OnPolicyTrainer",
    "OnlineDPOConfig",
    "OnlineDPOTrainer",
    "PPOConfig",
    "PPOTrainer",
    "ReinforcePPConfig",
    "ReinforcePPTrainer",
    "RLOOConfig",
    "RLOOTrainer",
]
