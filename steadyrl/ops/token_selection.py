"""Which tokens a policy loss trains on, and the entropy bonus: TRL 1.16's GRPO options beyond the loss type.

Shapes: B sequences in a micro-batch, C completion tokens.

    high_entropy_mask     keep a token if its entropy H_t >= the (1 - rho) quantile of the loss tokens' entropies
                          (rho = top_entropy_quantile; "Beyond the 80/20 Rule", Wang et al., 2025)           [B, C]
    off_policy_mask       drop a sequence if A < 0 and its mean log(pi_sampling / pi) > delta
                          (off_policy_mask_threshold; DeepSeek-V3.2, 2025, Eq. 9)                           [B, 1]
    entropy_bonus         mean H_t over the kept loss tokens; the loss is L_policy - coef x bonus
    adaptive_entropy_coef coef + delta where the step's entropy <= target, else coef - delta, within
                          [coef_min, coef_max] (Skywork-OR1, He et al., 2025); applied only while entropy <= target
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float, pooled: torch.Tensor) -> torch.Tensor:
    """bool [B, C]: the loss tokens (``mask`` [B, C]) whose ``entropy`` [B, C] is at least the ``quantile`` (in [0, 1],
    linear interpolation) of ``pooled`` [n], the loss tokens' entropies the threshold is taken over (this micro-batch's,
    or every process's for it); all False if there is none."""
    if pooled.numel() == 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    threshold = torch.quantile(pooled.float(), quantile)
    return (entropy * mask.float() >= threshold) & mask.bool()


def off_policy_mask(
    advantages: torch.Tensor,  # [B]
    logprobs: torch.Tensor,  # [B, C] under the policy being trained
    sampling_logprobs: torch.Tensor,  # [B, C] under the policy that sampled (the engine's where it reported them)
    mask: torch.Tensor,  # [B, C]
    threshold: float,
) -> torch.Tensor:
    """[B, 1] in ``mask``'s dtype: 0 for a sequence with a negative advantage whose mean per-token KL estimate
    log(pi_sampling / pi) over its loss tokens exceeds ``threshold``, 1 for the others. Tokens the engine could not
    score (NaN) count as no evidence (0)."""
    divergence = torch.nan_to_num(sampling_logprobs - logprobs.detach(), nan=0.0) * mask
    mean = divergence.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return ((advantages.unsqueeze(1) >= 0) | (mean <= threshold)).to(mask.dtype)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean entropy (with gradient) over the tokens of ``mask`` [B, C] the policy loss trains on: the same
    meaning for every loss type (not rescaled by its aggregation)."""
    mask = mask.to(entropy.dtype)
    return (entropy * mask).sum() / mask.sum().clamp(min=1.0)


class EntropyControl(NamedTuple):
    """``use_adaptive_entropy``'s settings (GRPOConfig's names)."""

    coef_min: float
    coef_max: float
    coef_delta: float
    target: float


def adaptive_entropy_coef(coef: float, entropy: float, control: EntropyControl) -> float:
    """The coefficient for the next optimizer step, from this step's mean entropy over the trained tokens: raised by
    ``coef_delta`` where the entropy fell to the target or below (collapse), lowered otherwise, within the bounds."""
    if entropy <= control.target:
        return min(coef + control.coef_delta, control.coef_max)
    return max(coef - control.coef_delta, control.coef_min)
