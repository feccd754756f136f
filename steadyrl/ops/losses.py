"""The algorithms' losses. Shapes: B sequences in a micro-batch, C completion tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .masked import masked_mean
from .policy_loss import clipped_surrogate


def clipped_policy_loss(
    logprobs: torch.Tensor,  # [B, C] under the policy being trained
    old_logprobs: torch.Tensor,  # [B, C] under the policy that generated the rollout
    advantages: torch.Tensor,  # [B, C] or [B, 1]
    mask: torch.Tensor,  # [B, C]
    cliprange: float,
    cliprange_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate: mean over tokens of max(-A r, -A clip(r, 1 - eps, 1 + eps_high)), r = pi / pi_old;
    ``cliprange_high`` (DAPO's clip-higher, TRL's ``epsilon_high``) defaults to ``cliprange``."""
    log_ratio = logprobs - old_logprobs
    per_token, bound = clipped_surrogate(log_ratio, advantages, cliprange, cliprange_high)
    loss = masked_mean(per_token, mask)
    metrics = {
        "clip_ratio": masked_mean((bound["low"] | bound["high"]).float(), mask).item(),
        "approx_kl": masked_mean(0.5 * log_ratio.detach() ** 2, mask).item(),
    }
    return loss, metrics


def clipped_value_loss(
    values: torch.Tensor,  # [B, C] predicted by the critic being trained
    old_values: torch.Tensor,  # [B, C] predicted when the rollout was made
    returns: torch.Tensor,  # [B, C] GAE targets
    mask: torch.Tensor,  # [B, C]
    cliprange_value: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 * mean over tokens of max((V - R)^2, (V_clipped - R)^2), V_clipped = V_old + clip(V - V_old, +-eps)."""
    clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(unclipped_loss, clipped_loss), mask)
    return loss, {"value_clip_ratio": masked_mean((clipped_loss > unclipped_loss).float(), mask).item()}


def pair_logps(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B/2, 2]: (chosen, rejected) sequence log-probs, summed over completion tokens, of consecutive row pairs."""
    return (logprobs * mask).sum(1).view(-1, 2)


def dpo_logits(policy: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """[P]: (log pi(y_w) - log pi(y_l)) - (log ref(y_w) - log ref(y_l)) from [P, 2] pair log-probs."""
    return (policy[:, 0] - policy[:, 1]) - (reference[:, 0] - reference[:, 1])


def preference_loss(logits: torch.Tensor, beta: float, loss_type: str) -> torch.Tensor:
    """Per-pair loss [P] from the DPO logits: ``sigmoid`` -log sigmoid(beta logits) (Rafailov et al., 2023),
    ``ipo`` (logits - 1 / (2 beta))^2 (Azar et al., 2023)."""
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * logits)
    return (logits - 1 / (2 * beta)) ** 2
