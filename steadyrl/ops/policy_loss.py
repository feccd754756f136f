"""The clipped policy-gradient loss family of GRPO, DAPO and Dr. GRPO (TRL's ``loss_type``), and TRL's RLOO loss.

Shapes: B sequences in a micro-batch, C completion tokens. A per-token loss is [B, C], or [B, 1] with one
importance weight per sequence; the aggregation multiplies it by the [B, C] loss mask either way.

    w = pi / pi_old            per token ("token"), or exp(mean log-ratio of the sequence) ("sequence", GSPO)
    l = -min(w A, clip(w, 1 - eps, 1 + eps_high) A)          with ``delta``: w capped at delta first (two-sided)
    grpo     mean over sequences of each sequence's token mean          (Shao et al., 2024)
    bnpo     token mean over the micro-batch
    dr_grpo  token sum / (B x max_completion_length)                     (Liu et al., 2025)
    dapo     token sum / mean loss tokens per micro-batch of the rollout (Yu et al., 2025): a token mean over the
             whole optimizer step, across accumulation and processes
"""

from __future__ import annotations

import math

import torch

from .masked import masked_mean

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
ENGINE_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_log_weights(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """log(pi / pi_old): [B, C] per token, or [B, 1] the mean over the sequence's tokens (GSPO's ``sequence``)."""
    log_ratio = logprobs - old_logprobs
    if level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def clipped_surrogate(
    log_weights: torch.Tensor,  # [B, C] or [B, 1]
    advantages: torch.Tensor,  # [B, 1] or [B, C]
    cliprange: float,
    cliprange_high: float | None = None,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate per token, -min(w A, clip(w, 1 - eps, 1 + eps_high) A), w = exp(log_weights); with
    ``delta`` the unclipped w is capped at ``delta`` too. Returns the loss and [B, C]-broadcastable bool masks of
    where the clip binds: ``low`` (w < 1 - eps, A < 0), ``high`` (w > 1 + eps_high, A > 0)."""
    high = cliprange if cliprange_high is None else cliprange_high
    weights = torch.exp(log_weights)
    clipped = weights.clamp(1 - cliprange, 1 + high)
    capped = weights if delta is None else weights.clamp(max=delta)
    loss = -torch.min(capped * advantages, clipped * advantages)
    bound = {"low": (weights < 1 - cliprange) & (advantages < 0), "high": (weights > 1 + high) & (advantages > 0)}
    return loss, bound


def aggregate_token_loss(
    per_token_loss: torch.Tensor,  # [B, C] or [B, 1]
    mask: torch.Tensor,  # [B, C]
    loss_type: str,
    max_completion_length: int | None = None,
    tokens_per_micro_batch: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """One micro-batch's loss from its per-token loss, as ``loss_type`` normalises it (see the module docstring).
    ``dr_grpo`` needs ``max_completion_length``; ``dapo`` needs ``tokens_per_micro_batch``."""
    mask = mask.to(per_token_loss.dtype)
    masked = per_token_loss * mask  # [B, C]
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return masked.sum() / (masked.shape[0] * max_completion_length)
    if loss_type == "dapo":
        return masked.sum() / torch.as_tensor(tokens_per_micro_batch).clamp(min=1.0)
    raise ValueError(f"loss_type={loss_type!r} is invalid: use one of {', '.join(LOSS_TYPES)}.")


def sequence_ratio_loss(
    logprobs: torch.Tensor,  # [B, C]
    old_logprobs: torch.Tensor,  # [B, C]
    advantages: torch.Tensor,  # [B]
    mask: torch.Tensor,  # [B, C]
    cliprange: float,
    cliprange_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's RLOO loss: one importance ratio per sequence, exp(sum of its token log-ratios), clipped, mean over
    the sequences; the clip masks as ``clipped_surrogate``'s, [B]."""
    mask = mask.to(logprobs.dtype)
    log_ratio = ((logprobs - old_logprobs) * mask).sum(1)  # [B]
    loss, bound = clipped_surrogate(log_ratio, advantages, cliprange, cliprange_high)
    return loss.mean(), bound


def clip_metrics(bound: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """Shares of the loss tokens where the clip binds: ``clip_ratio/low_mean``, ``/high_mean``, ``/region_mean``
    (TRL's names) and ``clip_ratio`` (the region's, steadyrl's name)."""
    mask = mask.float()

    def share(where: torch.Tensor) -> float:
        where = where.expand(mask.shape) if where.dim() == 2 else where.unsqueeze(-1).expand(mask.shape)
        return masked_mean(where.float(), mask).item()

    region = share(bound["low"] | bound["high"])
    return {
        "clip_ratio/low_mean": share(bound["low"]),
        "clip_ratio/high_mean": share(bound["high"]),
        "clip_ratio/region_mean": region,
        "clip_ratio": region,
    }


def engine_importance_weights(
    logprobs: torch.Tensor,  # [N, C] the trainer's, of the sampling policy
    engine_logprobs: torch.Tensor,  # [N, C] the generation engine's (vLLM), of the same tokens
    mask: torch.Tensor,  # [N, C]
    mode: str,
    clip_max: float | None,
    clip_min: float | None = None,
) -> torch.Tensor:
    """Truncated (or masked) importance sampling for the engine/trainer mismatch (Yao et al., 2025; TRL's
    ``vllm_importance_sampling_correction``): pi_trainer / pi_engine per token [N, C] or per sequence [N, 1];
    ``*_truncate`` clamps it into [clip_min, clip_max], ``*_mask`` sets it to 0 outside."""
    diff = torch.nan_to_num((logprobs - engine_logprobs) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def importance_ratio_metrics(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Min, mean and max of the engine importance weights [N, C] or [N, 1] over the loss tokens ``mask`` [N, C]
    (TRL's ``sampling/importance_sampling_ratio/*``); none where there is no loss token."""
    values = weights.expand(mask.shape)[mask.bool()] if weights.shape[1] > 1 else weights.flatten()
    if not values.numel():
        return {}
    name = "sampling/importance_sampling_ratio"
    return {
        f"{name}/min": values.min().item(),
        f"{name}/mean": values.mean().item(),
        f"{name}/max": values.max().item(),
    }
