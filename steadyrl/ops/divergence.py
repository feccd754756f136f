"""The generalized Jensen-Shannon divergence between a student's and a teacher's next-token distributions over the
whole vocabulary, per completion token, from their last hidden states: the LM heads project a chunk of positions at
a time, so no [B, C, V] logits of either model (nor their gradient) ever exist.

Shapes: B sequences, C completion tokens, N = B x C positions, H / Ht the student's / teacher's hidden size, V the
shared vocabulary, r the positions of one chunk. With p_s = softmax(z_s / T), p_t = softmax(z_t / T) at position i::

    beta = 0        KL(p_t || p_s)                                      forward KL
    beta = 1        KL(p_s || p_t)                                      reverse KL
    0 < beta < 1    beta KL(p_t || m) + (1 - beta) KL(p_s || m),  m = (1 - beta) p_s + beta p_t

(TRL's ``DistillationTrainer``; Agarwal et al. 2024, "On-Policy Distillation of Language Models"). At most six
[r, V] float32 tensors are alive at once, forward or backward; r = DIVERGENCE_CHUNK_LOGITS // V.

As in head_logprobs.py, the student runs whole with its output embedding's forward replaced for the call, so every
wrapper's hooks run (ZeRO-3's gather, FSDP2's unshard, PEFT); the teacher's hidden states come from its own whole
forward the same way (``completion_hidden_states``), and its head weight whole (``frozen_head``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..vision import ImageBatch
from .head_logprobs import HeadGradients, chunk_logits, chunkable_head, compute_dtype, warn_full_logits_once
from .logit_rows import model_logits
from .logprobs import completion_logits, model_inputs

# logits (64 MiB in float32) per [r, V] tensor: 110 positions at V = 151,936
DIVERGENCE_CHUNK_LOGITS = 2**24


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax of float32 ``logits`` [r, V] in place (the tensor is reused)."""
    return logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))


def _log_mixture(log_ps: torch.Tensor, log_pt: torch.Tensor, beta: float) -> torch.Tensor:
    """log m [r, V] of m = (1 - beta) p_s + beta p_t (0 < beta < 1)."""
    return torch.logaddexp(log_ps + math.log(1 - beta), log_pt + math.log(beta))


def divergence_of_log_probs(
    log_ps: torch.Tensor, log_pt: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Generalized JSD [r] of the student's and teacher's log-probs [r, V] (see the module's formula), and for
    0 < beta < 1 KL(p_s || m) [r], which the gradient needs."""
    if beta == 0.0:
        return (log_pt.exp() * (log_pt - log_ps)).sum(-1), None
    if beta == 1.0:
        return (log_ps.exp() * (log_ps - log_pt)).sum(-1), None
    log_m = _log_mixture(log_ps, log_pt, beta)
    kl_student = (log_ps.exp() * (log_ps - log_m)).sum(-1)
    kl_teacher = (log_pt.exp() * (log_pt - log_m)).sum(-1)
    return beta * kl_teacher + (1 - beta) * kl_student, kl_student


def generalized_jsd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float = 1.0
) -> torch.Tensor:
    """Generalized JSD [...] between softmax(student_logits / T) and softmax(teacher_logits / T) [..., V], in float32,
    differentiable by autograd: the reference formula, for logits that exist whole."""
    log_ps = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_pt = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return divergence_of_log_probs(log_ps, log_pt, beta)[0]


def divergence_grad(log_ps: torch.Tensor, log_pt: torch.Tensor, beta: float, divergence, kl_student) -> torch.Tensor:
    """d divergence / d (z_s / T) [r, V], written into ``log_ps``'s memory (it is not read again)."""
    if beta == 0.0:  # p_s - p_t
        return log_ps.exp_().sub_(log_pt.exp_())
    if beta == 1.0:  # p_s (log p_s - log p_t - KL(p_s || p_t))
        grad = log_ps - log_pt
        return grad.sub_(divergence.unsqueeze(-1)).mul_(log_ps.exp_())
    # (1 - beta) p_s (log p_s - log m - KL(p_s || m))
    grad = _log_mixture(log_ps, log_pt, beta).neg_().add_(log_ps).sub_(kl_student.unsqueeze(-1))
    return grad.mul_(log_ps.exp_()).mul_(1 - beta)


class ChunkedHeadDivergence(torch.autograd.Function):
    """Generalized JSD [N] (and the student's entropy [N], without gradient) of the student's distribution
    softmax((hidden @ weight.T + bias) / T) [N, H] against the teacher's from ``teacher_hidden`` [N, Ht] and its
    head, ``rows`` positions at a time. Gradient for the student's hidden states, weight and bias only; the backward
    recomputes each chunk's logits."""

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, teacher_hidden, teacher_weight, teacher_bias, beta, temperature, dtype, rows
    ):
        ctx.set_materialize_grads(False)
        divergence = hidden.new_empty(len(hidden), dtype=torch.float32)
        entropy, kl_student = torch.empty_like(divergence), torch.empty_like(divergence)
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            tw = teacher_weight.to(teacher_hidden.dtype)
            tb = None if teacher_bias is None else teacher_bias.to(teacher_hidden.dtype)
            for start in range(0, len(hidden), rows):
                part = slice(start, start + rows)
                log_ps = _log_probs(chunk_logits(hidden[part], w, b, temperature))
                log_pt = _log_probs(chunk_logits(teacher_hidden[part], tw, tb, temperature))
                divergence[part], kl = divergence_of_log_probs(log_ps, log_pt, beta)
                if kl is not None:
                    kl_student[part] = kl
                entropy[part] = -(log_ps.exp() * log_ps).sum(-1)
        saved = (hidden, weight, bias, teacher_hidden, teacher_weight, teacher_bias, divergence, kl_student)
        ctx.save_for_backward(*saved)
        ctx.beta, ctx.temperature, ctx.dtype, ctx.rows = beta, temperature, dtype, rows
        ctx.mark_non_differentiable(entropy)
        return divergence, entropy

    @staticmethod
    def backward(ctx, grad: torch.Tensor | None, _):
        hidden, weight, bias, teacher_hidden, teacher_weight, teacher_bias, divergence, kl_student = ctx.saved_tensors
        if grad is None:
            return (None,) * 10
        beta, temperature, dtype = ctx.beta, ctx.temperature, ctx.dtype
        grads = HeadGradients(hidden, weight, bias, ctx.needs_input_grad[:3])
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            tw = teacher_weight.to(teacher_hidden.dtype)
            tb = None if teacher_bias is None else teacher_bias.to(teacher_hidden.dtype)
            for start in range(0, len(hidden), ctx.rows):
                part = slice(start, start + ctx.rows)
                log_ps = _log_probs(chunk_logits(hidden[part], w, b, temperature))
                log_pt = _log_probs(chunk_logits(teacher_hidden[part], tw, tb, temperature))
                grad_logits = divergence_grad(log_ps, log_pt, beta, divergence[part], kl_student[part])
                del log_pt
                grad_logits.mul_(grad[part].float().unsqueeze(-1) / temperature)
                grads.add(part, grad_logits.to(dtype), w)
        return *grads.result(), *(None,) * 7


@contextlib.contextmanager
def _head_replaced(head: nn.Linear, forward) -> Iterator[list[int]]:
    """While open, ``head(hidden_states)`` is ``forward(hidden_states)``; yields a list with one item per call."""
    calls: list[int] = []

    def counted(hidden_states: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return forward(hidden_states)

    head.forward = counted
    try:
        yield calls
    finally:
        del head.forward


def _completion_positions(hidden_states: torch.Tensor, width: int) -> torch.Tensor:
    return hidden_states[:, -(width + 1) : -1]  # position t predicts token t + 1


@torch.no_grad()
def completion_hidden_states(
    model: nn.Module, prompt_ids, prompt_mask, completion_ids, completion_mask, images: ImageBatch | None = None
):
    """The last hidden states [B, C, H] that predict each completion token (what the LM head reads), from ``model``'s
    whole forward with its head's forward replaced; None where the chunked path does not apply to ``model``."""
    head, _ = chunkable_head(model)
    if head is None:
        return None
    width = completion_ids.shape[1]
    inputs = model_inputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, images)
    with _head_replaced(head, lambda hidden_states: _completion_positions(hidden_states, width)) as calls:
        hidden = model_logits(model, inputs, width + 1)
    return hidden if len(calls) == 1 else None


def completion_divergence(
    model: nn.Module,
    tokens: tuple[torch.Tensor, ...],
    teacher: nn.Module,
    teacher_head: tuple[torch.Tensor, torch.Tensor | None],
    beta: float,
    temperature: float,
    images: ImageBatch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized JSD [B, C] of the student ``model`` against ``teacher`` at each completion token of ``tokens``
    (prompt_ids, prompt_mask, completion_ids, completion_mask), with gradient for the student; and the student's
    entropy [B, C]. ``teacher_head``: the teacher's whole LM head (weight [V, Ht], bias or None). ``images``: the
    samples' image inputs, which both models read (a vision-language teacher of the student's family).

    Chunked (no [B, C, V] logits) where both heads are plain nn.Linear heads whose output is the logits; else (logged
    once) from both models' [B, C, V] logits, a few rows at a time."""
    completion_ids = tokens[2]
    width = completion_ids.shape[1]
    head, reason = chunkable_head(model)
    teacher_hidden = completion_hidden_states(teacher, *tokens, images) if head is not None else None
    if teacher_hidden is not None:
        rows = max(1, DIVERGENCE_CHUNK_LOGITS // head.out_features)
        weight, bias = teacher_head

        def forward(hidden_states: torch.Tensor) -> torch.Tensor:
            hidden = _completion_positions(hidden_states, width)
            teacher_rows = teacher_hidden.to(hidden.device).reshape(-1, teacher_hidden.shape[-1])
            args = (teacher_rows, weight.to(hidden.device), None if bias is None else bias.to(hidden.device))
            flat = hidden.reshape(-1, hidden.shape[-1])
            results = ChunkedHeadDivergence.apply(
                flat, head.weight, head.bias, *args, beta, temperature, compute_dtype(hidden), rows
            )
            return torch.stack(results, dim=-1).view(*completion_ids.shape, 2)

        inputs = model_inputs(model, *tokens, images)
        with _head_replaced(head, forward) as calls:
            output = model_logits(model, inputs, width + 1)  # [B, C, 2], read from the output, where hooks attach
        if len(calls) == 1:
            return output[..., 0], output[..., 1].detach()
        reason = f"its forward called its output embedding {len(calls)} times, not once"
    warn_full_logits_once(model, reason or "the teacher's output embedding is not a plain nn.Linear giving logits")
    student_logits = completion_logits(model, *tokens, images=images)
    teacher_logits = _teacher_logits(teacher, tokens, student_logits.shape[-1], images)
    return divergence_from_logits(student_logits, teacher_logits, beta, temperature)


@torch.no_grad()
def _teacher_logits(teacher: nn.Module, tokens, vocabulary: int, images: ImageBatch | None = None) -> torch.Tensor:
    """The teacher's [B, C, V] logits of the student's ``vocabulary`` rows: rows past them pad its embedding."""
    return completion_logits(teacher, *tokens, images=images)[..., :vocabulary]


def divergence_from_logits(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized JSD [B, C] (with autograd) and the student's entropy [B, C] from both models' [B, C, V] logits."""
    divergence = generalized_jsd(student_logits, teacher_logits, beta, temperature)
    with torch.no_grad():
        log_ps = F.log_softmax(student_logits.float() / temperature, dim=-1)
        entropy = -(log_ps.exp() * log_ps).sum(-1)
    return divergence, entropy
