"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al., 2024), with PPO-style ratio clipping.

Shapes: P prompts x k samples = N sequences, C completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ops import clipped_policy_loss, completion_logprobs, masked_mean
from .config import OnPolicyConfig
from .on_policy import OnPolicyTrainer


@dataclass
class RLOOConfig(OnPolicyConfig):
    """OnPolicyConfig plus RLOO's options. ``n_samples_per_prompt`` (k) must be at least 2."""

    normalize_advantages: bool = field(default=False, metadata={"help": "Whiten advantages over the rollout."})

    def __post_init__(self):
        if self.n_samples_per_prompt < 2:
            raise ValueError(
                f"n_samples_per_prompt={self.n_samples_per_prompt} is invalid for RLOO: the leave-one-out "
                "baseline needs at least 2 completions per prompt."
            )
        super().__post_init__()


class RLOOTrainer(OnPolicyTrainer):
    """``RLOOTrainer(model, args=RLOOConfig(...), train_dataset, processing_class, reward_funcs, ...)``."""

    algorithm_name = "rloo"
    config_class = RLOOConfig

    def compute_advantages(self, experience: dict[str, torch.Tensor]) -> dict[str, float]:
        k, mask = self.args.n_samples_per_prompt, experience["completion_mask"]
        kl = ((experience["old_logprobs"] - experience["ref_logprobs"]) * mask).sum(1)  # [N], k1 estimator
        rewards = (experience["scores"] - self.args.beta * kl).view(-1, k)  # [P, k]
        baseline = (rewards.sum(1, keepdim=True) - rewards) / (k - 1)  # mean reward of the other k-1 samples
        advantages = (rewards - baseline).flatten()  # [N]
        if self.args.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        experience["advantages"] = advantages
        return {"rlhf_reward": rewards.mean().item(), "advantages_std": advantages.std().item()}

    def compute_loss_on_batch(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch["completion_mask"]  # [B, C]
        logprobs, entropy = completion_logprobs(
            model,
            batch["prompt_ids"],
            batch["prompt_mask"],
            batch["completion_ids"],
            mask,
            temperature=self.args.temperature,
            with_entropy=True,
        )
        loss, metrics = clipped_policy_loss(
            logprobs, batch["old_logprobs"], batch["advantages"].unsqueeze(1), mask, self.args.cliprange
        )
        return loss, {**metrics, "entropy": masked_mean(entropy, mask).item()}
