"""PPO's two losses as policy-loss objectives (registered as ``ppo`` and ``ppo_value`` in loss_registry.py): the
actor's clipped surrogate per token and the critic's clipped value loss (Schulman et al., 2017; OpenRLHF's and TRL's
PPOv2). Shapes: B sequences, C completion tokens."""

from __future__ import annotations

import torch

from .masked import masked_mean
from .policy_loss import ClippedSurrogate, PolicyLoss, TokenLoss, flag_share


class PPOClippedSurrogate(ClippedSurrogate):
    """PPO's actor loss (Schulman et al., 2017), as PPOTrainer's: the clipped surrogate of the per-token ratio with
    one advantage per token (GAE's); logged: ``clip_ratio`` and ``approx_kl`` (the mean of 0.5 log-ratio^2)."""

    description = "PPO's clipped surrogate per token"
    reads = frozenset()

    @classmethod
    def from_config(cls, config) -> PPOClippedSurrogate:
        return cls(config.cliprange, config.cliprange_high)

    def __call__(self, logprobs, old_logprobs, advantages, mask):
        out = super().__call__(logprobs, old_logprobs, advantages, mask)
        return TokenLoss(out.loss, out.log_weights, {**out.flags, "approx_kl": 0.5 * out.log_weights.detach() ** 2})

    def metrics(self, flags, mask):
        return {
            "clip_ratio": flag_share(flags["low"] | flags["high"], mask),
            "approx_kl": masked_mean(flags["approx_kl"], mask).item(),
        }


class ClippedValue(PolicyLoss):
    """PPO's critic loss (as OpenRLHF's and TRL's PPOv2): 0.5 max((V - R)^2, (V_clipped - R)^2) per token,
    V_clipped = V_old + clip(V - V_old, +-``cliprange_value``). It takes the critic's values [B, C], the rollout's
    values [B, C] and the returns [B, C] where a policy objective takes log-probs, old log-probs and advantages.
    Logged: ``value_clip_ratio``, the share of tokens where the clipped term is the larger."""

    description = "PPO's clipped value loss"
    reads = frozenset()

    def __init__(self, cliprange_value: float = 0.2) -> None:
        self.cliprange_value = cliprange_value

    @classmethod
    def from_config(cls, config) -> ClippedValue:
        return cls(config.cliprange_value)

    def __call__(self, values, old_values, returns, mask):
        clipped_values = old_values + (values - old_values).clamp(-self.cliprange_value, self.cliprange_value)
        unclipped, clipped = (values - returns) ** 2, (clipped_values - returns) ** 2
        no_ratio = torch.zeros_like(values[:, :1])  # a value loss weighs no KL term
        return TokenLoss(0.5 * torch.max(unclipped, clipped), no_ratio, {"value_clip_ratio": clipped > unclipped})
