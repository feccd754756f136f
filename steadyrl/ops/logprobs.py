"""Token ids in, log-probabilities out. Shapes: B sequences, P prompt tokens (left-padded), C completion tokens
(right-padded), V vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def ends_without_eos(completion_ids: torch.Tensor, completion_mask: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """[B] bool: the completion's last token is not EOS (it was cut at max_completion_length)."""
    last = completion_ids.gather(1, last_token_index(completion_mask)[:, None])
    return last.squeeze(1) != eos_token_id


def sequence_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: the k1 estimate of KL(pi || pi_ref) of each sequence, sum over its tokens of log pi - log pi_ref."""
    return ((logprobs - ref_logprobs) * mask).sum(1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1 and k3 estimators)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":  # unbiased and always >= 0: r - 1 - log r with r = pi_ref / pi
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"kl_estimator={estimator!r} is invalid: use 'k1' or 'k3'.")


def batched_forward(model: torch.nn.Module, forward, tensors: tuple[torch.Tensor, ...],
                    batch_size: int) -> torch.Tensor:  # fmt: skip
    """``forward(model, *rows)`` in eval mode over chunks of ``batch_size`` rows of ``tensors``, concatenated."""
    was_training = model.training
    model.eval()
    chunks = []
    for i in range(0, tensors[0].shape[0], batch_size):
        chunks.append(forward(model, *(tensor[i : i + batch_size] for tensor in tensors)))
    model.train(was_training)
    return torch.cat(chunks)


def batched_logprobs(model: torch.nn.Module, tensors: tuple[torch.Tensor, ...], temperature: float,
                     batch_size: int) -> torch.Tensor:  # fmt: skip
    """[N, C] ``completion_logprobs`` of (prompt_ids, prompt_mask, completion_ids, completion_mask) in eval mode,
    ``batch_size`` rows at a time."""

    def logprobs(model, *rows):
        return completion_logprobs(model, *rows, temperature=temperature)[0]

    return batched_forward(model, logprobs, tensors, batch_size)
