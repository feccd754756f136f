"""Tensor helpers shared by the algorithms. Shapes: B sequences, P prompt tokens, C completion tokens, V vocab."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [B, P], left-padded
    prompt_mask: torch.Tensor,  # [B, P]
    completion_ids: torch.Tensor,  # [B, C], right-padded
    completion_mask: torch.Tensor,  # [B, C]
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, C] of the completion tokens under ``model`` (and the entropy [B, C] if asked)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).logits
    logits = logits[:, prompt_ids.shape[1] - 1 : -1].float() / temperature  # [B, C, V]: token t predicts t+1
    logp = F.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy
