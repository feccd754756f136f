"""The model's logits and what is read from them: log-probs of given tokens and entropies, a few rows of [B, C, V] at
a time, with no [B, C, V] intermediate kept for the backward pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .head_logprobs import shifted_entropy


def model_logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor], keep: int, outputs: dict | None = None):
    """``model(**inputs).logits`` with the LM head run on the last ``keep`` positions only (``logits_to_keep``), for
    models that take it; every position's otherwise. With ``outputs`` (a dict), a Mixture-of-Experts model is asked
    for its router logits and its load-balancing loss is put there as ``aux_loss``."""
    extra = {} if outputs is None else {"output_router_logits": True}
    try:
        result = model(**inputs, use_cache=False, logits_to_keep=keep, **extra)
    except TypeError as err:  # a model without logits_to_keep: the LM head over every position
        if "logits_to_keep" not in str(err):
            raise
        result = model(**inputs, use_cache=False, **extra)
    if outputs is not None:
        outputs["aux_loss"] = result.aux_loss
    return result.logits


CHUNK_LOGITS = 2**22  # logits (16 MiB in float32) per piece of the [B, C, V] logits worked on at once


# Logits (128 MiB in float32) per chunk of completion positions the LM head projects at once on the chunked path:
# each chunk reads the whole head weight, so chunks of a few rows would make the matmul memory-bound.
CHUNK_HEAD_LOGITS = 2**25


def row_chunks(logits: torch.Tensor) -> list[slice]:
    """Slices of ``logits``' rows, each holding at most CHUNK_LOGITS logits (at least one row): a large vocabulary
    is worked on a few rows at a time, a small one all at once."""
    per_row = max(1, logits[0].numel()) if len(logits) else 1
    rows = max(1, CHUNK_LOGITS // per_row)
    return [slice(i, i + rows) for i in range(0, len(logits), rows)]


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits`` in float32 divided by ``temperature`` (no copy for float32 logits at temperature 1)."""
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


class _GatheredLogSoftmax(torch.autograd.Function):
    """log_softmax(logits / temperature) at token_ids, [B, C] from [B, C, V], a few rows at a time. The forward
    returns log_softmax's own values but keeps no [B, C, V] log-softmax; the backward rebuilds the softmax from the
    logits (which the graph holds anyway)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, token_ids: torch.Tensor, temperature: float) -> torch.Tensor:
        parts = [
            F.log_softmax(scaled(logits[rows], temperature), dim=-1).gather(-1, token_ids[rows].unsqueeze(-1))
            for rows in row_chunks(logits)
        ]
        ctx.save_for_backward(logits, token_ids)
        ctx.temperature = temperature
        return torch.cat(parts).squeeze(-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, token_ids = ctx.saved_tensors
        parts = []
        for rows in row_chunks(logits):  # d log p(t) / d x = (onehot(t) - softmax(x)) / T
            part = torch.softmax(scaled(logits[rows], ctx.temperature), dim=-1).mul_(-grad[rows].unsqueeze(-1))
            part.scatter_add_(-1, token_ids[rows].unsqueeze(-1), grad[rows].unsqueeze(-1))
            parts.append((part if ctx.temperature == 1.0 else part.div_(ctx.temperature)).to(logits.dtype))
        return torch.cat(parts), None, None


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at ``token_ids``: [B, C] from [B, C, V], with no [B, C, V] log-softmax (or
    float32 copy of bf16 logits) kept for the backward pass."""
    return _GatheredLogSoftmax.apply(logits, token_ids, temperature)


class _Entropy(torch.autograd.Function):
    """Entropy [B, C] of softmax(logits / temperature) from [B, C, V], a few rows at a time, keeping no [B, C, V]
    intermediate: the backward rebuilds log-softmax from the logits (dH / dx = -p (log p + H) / T)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        parts = []
        for rows in row_chunks(logits):
            x = scaled(logits[rows], temperature)
            parts.append(shifted_entropy(x - x.amax(-1, keepdim=True))[0])
        entropy = torch.cat(parts)
        ctx.save_for_backward(logits, entropy)
        ctx.temperature = temperature
        return entropy

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, entropy = ctx.saved_tensors
        parts = []
        for rows in row_chunks(logits):
            logp = F.log_softmax(scaled(logits[rows], ctx.temperature), dim=-1)
            part = logp.exp().mul_(logp.add(entropy[rows].unsqueeze(-1))).mul_(-grad[rows].float().unsqueeze(-1))
            parts.append((part if ctx.temperature == 1.0 else part.div_(ctx.temperature)).to(logits.dtype))
        return torch.cat(parts), None


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy [B, C] of softmax(logits / temperature), a few rows at a time: logsumexp - sum(p * logits), both of
    logits minus their row max (shifted_entropy); differentiable (an entropy bonus) without a [B, C, V] copy."""
    return _Entropy.apply(logits, temperature)


def logprobs_from_logits(
    logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, C] (and entropy if asked) from the [B, C, V] logits."""
    entropy = token_entropy(logits, temperature) if with_entropy else None
    return token_logprobs(logits, completion_ids, temperature), entropy
