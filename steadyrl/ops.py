"""Tensor helpers shared by the algorithms. Shapes: B sequences, P prompt tokens, C completion tokens, V vocab."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of the entries where ``mask`` is 1."""
    mean = masked_mean(values, mask)
    count = mask.sum().clamp(min=2)
    return ((values - mean) ** 2 * mask).sum() / (count - 1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / std over the masked entries; masked-out entries are zeroed."""
    whitened = (values - masked_mean(values, mask)) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    if not shift_mean:
        whitened = whitened + masked_mean(values, mask)
    return whitened * mask


def joined_inputs(
    prompt_ids: torch.Tensor,  # [B, P], left-padded
    prompt_mask: torch.Tensor,  # [B, P]
    completion_ids: torch.Tensor,  # [B, C], right-padded
    completion_mask: torch.Tensor,  # [B, C]
) -> dict[str, torch.Tensor]:
    """Model inputs for prompt + completion, with position ids that skip the left padding."""
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    return {
        "input_ids": torch.cat([prompt_ids, completion_ids], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
    }


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, C] of the completion tokens under ``model`` (and the entropy [B, C] if asked)."""
    inputs = joined_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    logits = model(**inputs, use_cache=False).logits
    logits = logits[:, prompt_ids.shape[1] - 1 : -1].float() / temperature  # [B, C, V]: token t predicts t+1
    logp = F.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


def last_token_index(completion_mask: torch.Tensor) -> torch.Tensor:
    """Index [B] of each completion's last token (0 for an empty completion)."""
    return (completion_mask.sum(1).long() - 1).clamp(min=0)


def generalized_advantage_estimation(
    rewards: torch.Tensor,  # [B, C] per-token rewards
    values: torch.Tensor,  # [B, C] V(s_t), the value before completion token t
    mask: torch.Tensor,  # [B, C] 1 on completion tokens
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al., 2016): A_t = sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t.

    The value after the last token is 0 (the episode ends). Returns ``(advantages, returns)``, both [B, C],
    zero on padding; returns = advantages + values are the critic's regression targets.
    """
    mask = mask.to(values.dtype)
    values, rewards = values * mask, rewards * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def clipped_policy_loss(
    logprobs: torch.Tensor,  # [B, C] under the policy being trained
    old_logprobs: torch.Tensor,  # [B, C] under the policy that generated the rollout
    advantages: torch.Tensor,  # [B, C] or [B, 1]
    mask: torch.Tensor,  # [B, C]
    cliprange: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate: mean over tokens of max(-A r, -A clip(r, 1 - eps, 1 + eps)), r = pi / pi_old."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange, 1 + cliprange)
    loss = masked_mean(torch.max(unclipped, clipped), mask)
    metrics = {
        "clip_ratio": masked_mean((clipped > unclipped).float(), mask).item(),
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


def pad_prompts_and_completions(prompt_ids, completion_ids, pad_token_id: int, device=None) -> dict[str, torch.Tensor]:
    """Lists of token ids -> ``prompt_ids``/``prompt_mask`` [B, P] (left-padded), ``completion_*`` [B, C] (right)."""
    p_width = max(len(p) for p in prompt_ids)
    c_width = max(1, max(len(c) for c in completion_ids))

    def tensor(rows):
        return torch.tensor(rows, dtype=torch.long, device=device)

    return {
        "prompt_ids": tensor([[pad_token_id] * (p_width - len(p)) + p for p in prompt_ids]),
        "prompt_mask": tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompt_ids]),
        "completion_ids": tensor([c + [pad_token_id] * (c_width - len(c)) for c in completion_ids]),
        "completion_mask": tensor([[1] * len(c) + [0] * (c_width - len(c)) for c in completion_ids]),
    }


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1 and k3 estimators)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":  # unbiased and always >= 0: r - 1 - log r with r = pi_ref / pi
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"kl_estimator={estimator!r} is invalid: use 'k1' or 'k3'.")


@contextlib.contextmanager
def offloaded(model: torch.nn.Module, device, offload: bool):
    """With ``offload``, move ``model`` to ``device`` for the block and back to CPU memory after it."""
    if offload:
        model.to(device)
    try:
        yield model
    finally:
        if offload:
            model.to("cpu")
