"""Token ids in, log-probabilities out. Shapes: B sequences, P prompt tokens (left-padded), C completion tokens
(right-padded), V vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .head_logprobs import chunkable_head, head_returns_logprobs, shifted_entropy, warn_full_logits_once


def padded_width(longest: int, multiple_of: int | None = None) -> int:
    """``longest`` rounded up to a multiple of ``multiple_of`` (TRL's ``pad_to_multiple_of``; None: ``longest``)."""
    return longest if not multiple_of else -(-longest // multiple_of) * multiple_of


def pad_prompts_and_completions(
    prompt_ids, completion_ids, pad_token_id: int, device=None, multiple_of: int | None = None
) -> dict[str, torch.Tensor]:
    """Lists of token ids -> ``prompt_ids``/``prompt_mask`` [B, P] (left-padded), ``completion_*`` [B, C] (right);
    P and C the longest prompt and completion, rounded up to a multiple of ``multiple_of`` if given."""
    p_width = padded_width(max(len(p) for p in prompt_ids), multiple_of)
    c_width = padded_width(max(1, max(len(c) for c in completion_ids)), multiple_of)

    def tensor(rows):
        return torch.tensor(rows, dtype=torch.long, device=device)

    return {
        "prompt_ids": tensor([[pad_token_id] * (p_width - len(p)) + p for p in prompt_ids]),
        "prompt_mask": tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompt_ids]),
        "completion_ids": tensor([c + [pad_token_id] * (c_width - len(c)) for c in completion_ids]),
        "completion_mask": tensor([[1] * len(c) + [0] * (c_width - len(c)) for c in completion_ids]),
    }


def fit_columns(tensor: torch.Tensor, width: int, left: bool = False, value: int | float = 0) -> torch.Tensor:
    """``tensor`` [B, W, ...] cut or padded (with ``value``) to ``width`` columns, on the right or the ``left``."""
    extra = width - tensor.shape[1]
    if extra <= 0:
        return tensor[:, -width:] if left else tensor[:, :width]
    pad = tensor.new_full((tensor.shape[0], extra, *tensor.shape[2:]), value)
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=1)


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


def completion_logits(
    model: torch.nn.Module, prompt_ids, prompt_mask, completion_ids, completion_mask, outputs: dict | None = None
) -> torch.Tensor:
    """The logits [B, C, V] that predict each completion token: the LM head runs only on the last C + 1 positions
    (``logits_to_keep``), not on the prompt's, for models that take it. ``outputs``: see ``model_logits``."""
    inputs = joined_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    keep = completion_ids.shape[1] + 1
    return model_logits(model, inputs, keep, outputs)[:, -keep:-1]  # position t predicts token t + 1


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


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunked_head: bool = True,
    outputs: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, C] of the completion tokens under ``model`` (and the entropy [B, C] if asked), both
    differentiable.

    With ``chunked_head`` (and a plain nn.Linear head whose output is the logits), from the last hidden states, the
    head projecting CHUNK_HEAD_LOGITS // V positions at a time (head_logprobs.py): no [B, C, V] logits exist. Else,
    and for other models (logged once), from the [B, C, V] logits, a few rows at a time. ``outputs``: see
    ``model_logits`` (a Mixture-of-Experts model's load-balancing loss)."""
    head, reason = chunkable_head(model) if chunked_head else (None, "")
    if head is None:
        if reason:
            warn_full_logits_once(model, reason)
        return logprobs_from_logits(
            completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, outputs),
            completion_ids,
            temperature,
            with_entropy,
        )
    inputs = joined_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    keep = completion_ids.shape[1] + 1
    rows = max(1, CHUNK_HEAD_LOGITS // head.out_features)
    with head_returns_logprobs(head, completion_ids, temperature, with_entropy, rows) as calls:
        output = model_logits(model, inputs, keep, outputs)  # [B, C, 1 or 2]: read from the output (hooks attach)
    if len(calls) != 1:  # the forward did not go through get_output_embeddings() once: logits the plain way
        warn_full_logits_once(model, f"its forward called its output embedding {len(calls)} times, not once")
        logits = output if not calls else model_logits(model, inputs, keep, outputs)  # none: output is the logits
        return logprobs_from_logits(logits[:, -keep:-1], completion_ids, temperature, with_entropy)
    return output[..., 0], output[..., 1] if with_entropy else None


def logprobs_from_logits(
    logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, C] (and entropy if asked) from the [B, C, V] logits."""
    entropy = token_entropy(logits, temperature) if with_entropy else None
    return token_logprobs(logits, completion_ids, temperature), entropy


def trim_padding(
    prompt_ids, prompt_mask, completion_ids, completion_mask, multiple_of: int | None = None, pad_token_id: int = 0
) -> tuple[tuple[torch.Tensor, ...], int]:
    """The token tensors without the prompt columns that are padding in every row (on the left) and the completion
    columns that are padding in every row (on the right); and the completion width kept. With ``multiple_of`` both
    widths are rounded up to a multiple of it, padding with masked ``pad_token_id`` columns where the tensors are
    narrower (a buffer saved under another setting)."""
    used = prompt_mask.any(0).nonzero()
    p_width = padded_width(prompt_mask.shape[1] - int(used[0]) if len(used) else 1, multiple_of)
    used = completion_mask.any(0).nonzero()
    width = padded_width(int(used[-1]) + 1 if len(used) else 1, multiple_of)
    prompt = (fit_columns(prompt_ids, p_width, True, pad_token_id), fit_columns(prompt_mask, p_width, True))
    completion = (fit_columns(completion_ids, width, value=pad_token_id), fit_columns(completion_mask, width))
    return (*prompt, *completion), width


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


def batched_forward(
    model: torch.nn.Module, forward, tokens: tuple[torch.Tensor, ...], batch_size: int, multiple_of: int | None = None
) -> torch.Tensor:
    """[N, C] ``forward(model, prompt_ids, prompt_mask, completion_ids, completion_mask)`` in eval mode over chunks
    of ``batch_size`` rows of ``tokens``: rows of similar length share a chunk, and each chunk is trimmed to its own
    longest prompt and completion, rounded up to a multiple of ``multiple_of`` if given (the columns beyond a
    chunk's completions come back as 0)."""
    was_training = model.training
    model.eval()
    prompt_mask, completion_mask = tokens[1], tokens[3]
    order = torch.argsort(prompt_mask.sum(1) * completion_mask.shape[1] + completion_mask.sum(1), stable=True)
    output = None
    for i in range(0, len(order), batch_size):
        rows = order[i : i + batch_size]
        chunk, width = trim_padding(*(tensor[rows] for tensor in tokens), multiple_of)
        values = forward(model, *chunk)  # [b, width]
        if output is None:
            output = values.new_zeros(len(order), completion_mask.shape[1])
        width = min(width, output.shape[1])
        output[rows, :width] = values[:, :width]
    model.train(was_training)
    return output


def batched_logprobs(
    model: torch.nn.Module,
    tensors: tuple[torch.Tensor, ...],
    temperature: float,
    batch_size: int,
    multiple_of: int | None = None,
) -> torch.Tensor:
    """[N, C] ``completion_logprobs`` of (prompt_ids, prompt_mask, completion_ids, completion_mask) in eval mode,
    ``batch_size`` rows at a time, each chunk padded to a multiple of ``multiple_of`` columns if given."""

    def logprobs(model, *rows):
        return completion_logprobs(model, *rows, temperature=temperature)[0]

    return batched_forward(model, logprobs, tensors, batch_size, multiple_of)
