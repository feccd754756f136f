"""Token ids in, log-probabilities out. Shapes: B sequences, P prompt tokens (left-padded), C completion tokens
(right-padded), V vocabulary."""

from __future__ import annotations

import functools
import logging
import weakref

import torch

from ..vision import ImageBatch, computes_own_positions, image_positions, image_token_mask
from .head_logprobs import chunkable_head, head_returns_logprobs, unwrapped, warn_full_logits_once
from .logit_rows import CHUNK_HEAD_LOGITS, logprobs_from_logits, model_logits
from .packing import (
    PackedRows,
    pack_shared_prompts,
    packed_completion_logprobs,
    packing_fallback,
    padded_width,
)


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


def model_inputs(
    model: torch.nn.Module, prompt_ids, prompt_mask, completion_ids, completion_mask, images: ImageBatch | None = None
) -> dict[str, torch.Tensor]:
    """``joined_inputs`` with a vision-language model's image inputs; a model whose positions come from the images
    (Qwen's mrope) computes them itself from the attention mask, so no position ids are passed to it."""
    inputs = joined_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    if images is not None and images.has_images():
        in_completion = image_token_mask(model, completion_ids)  # a tool reply's images
        inputs.update(images.model_inputs(prompt_ids.shape[1], completion_ids.shape[1], in_completion))
        if computes_own_positions(model):
            del inputs["position_ids"]
    return inputs


def completion_logits(
    model: torch.nn.Module,
    prompt_ids,
    prompt_mask,
    completion_ids,
    completion_mask,
    outputs: dict | None = None,
    images: ImageBatch | None = None,
) -> torch.Tensor:
    """The logits [B, C, V] that predict each completion token: the LM head runs only on the last C + 1 positions
    (``logits_to_keep``), not on the prompt's, for models that take it. ``outputs``: see ``model_logits``;
    ``images``: a vision-language model's image inputs of the B samples."""
    inputs = model_inputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, images)
    keep = completion_ids.shape[1] + 1
    return model_logits(model, inputs, keep, outputs)[:, -keep:-1]  # position t predicts token t + 1


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
    packing: bool = False,
    images: ImageBatch | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, C] of the completion tokens under ``model`` (and the entropy [B, C] if asked), both
    differentiable.

    With ``chunked_head`` (and a plain nn.Linear head whose output is the logits), from the last hidden states, the
    head projecting CHUNK_HEAD_LOGITS // V positions at a time (head_logprobs.py): no [B, C, V] logits exist. Else,
    and for other models (logged once), from the [B, C, V] logits, a few rows at a time. ``outputs``: see
    ``model_logits`` (a Mixture-of-Experts model's load-balancing loss). With ``packing``, from one packed pass with
    each prompt shared by its completions (packing.py), where the model allows it (``packing_fallback``): with a
    vision-language model's ``images``, each group's images once too (its vision tower runs once per group), where a
    packed pass of the first such micro-batch equals the padded one (``images_packing_fallback``)."""
    tokens = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    images = images if images is not None and images.has_images() else None  # none in these samples: text only
    if packing and images is not None:
        if image_token_mask(model, completion_ids).any():  # a tool reply's image: its completion's own, not shared
            warn_padded_tool_images_once(model)
            packing = False
        elif images_packing_fallback(model, tokens, images, outputs):
            packing = False
        else:
            packed = pack_shared_prompts(*tokens, images=images, positions_of=functools.partial(image_positions, model))
            return packed_completion_logprobs(model, packed, temperature, with_entropy, chunked_head)
    if packing and not packing_fallback(model, tokens, _padded_logprobs, _packed_logprobs, outputs):
        return packed_completion_logprobs(model, pack_shared_prompts(*tokens), temperature, with_entropy, chunked_head)
    head, reason = chunkable_head(model) if chunked_head else (None, "")
    if head is None:
        if reason:
            warn_full_logits_once(model, reason)
        return logprobs_from_logits(
            completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, outputs, images),
            completion_ids,
            temperature,
            with_entropy,
        )
    inputs = model_inputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, images)
    keep = completion_ids.shape[1] + 1
    rows = max(1, CHUNK_HEAD_LOGITS // head.out_features)
    with head_returns_logprobs(head, completion_ids, temperature, with_entropy, rows) as calls:
        output = model_logits(model, inputs, keep, outputs)  # [B, C, 1 or 2]: read from the output (hooks attach)
    if len(calls) != 1:  # the forward did not go through get_output_embeddings() once: logits the plain way
        warn_full_logits_once(model, f"its forward called its output embedding {len(calls)} times, not once")
        logits = output if not calls else model_logits(model, inputs, keep, outputs)  # none: output is the logits
        return logprobs_from_logits(logits[:, -keep:-1], completion_ids, temperature, with_entropy)
    return output[..., 0], output[..., 1] if with_entropy else None


_images_checked: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
_tool_images_warned: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def warn_padded_tool_images_once(model: torch.nn.Module) -> None:
    inner = unwrapped(model)
    if inner not in _tool_images_warned:
        _tool_images_warned.add(inner)
        logging.getLogger(__name__).warning(
            "Micro-batches whose completions hold images (tool replies) run padded, not packed: only a prompt's "
            "images are shared by its completions."
        )


@torch.no_grad()
def images_packing_fallback(model: torch.nn.Module, tokens: tuple, images: ImageBatch, outputs: dict | None) -> str:
    """Why ``model``'s passes with images run padded ('' where they pack). Checked once per model, on the first
    micro-batch with images: the text probe (``packing_fallback``), then its packed pass against its padded pass on
    the completion tokens; a difference (a family whose attention treats image tokens specially: Gemma3's
    bidirectional image attention) is said once, and its passes run padded."""
    reason = packing_fallback(model, tokens, _padded_logprobs, _packed_logprobs, outputs)
    inner = unwrapped(model)
    if reason or inner in _images_checked:
        return reason or _images_checked[inner]
    was_training = model.training
    model.eval()
    try:
        expected, _ = completion_logprobs(model, *tokens, images=images)
        packed = pack_shared_prompts(*tokens, images=images, positions_of=functools.partial(image_positions, model))
        gap = ((expected - packed_completion_logprobs(model, packed, 1.0, False)[0]) * tokens[3]).abs().max().item()
        tolerance = 1e-4 if next(inner.parameters()).dtype == torch.float32 else 5e-2
        reason = "" if gap <= tolerance else f"a packed pass with its images differs from the padded pass by {gap:.2g}"
    except Exception as err:  # noqa: BLE001 - a model that cannot take packed image inputs: it runs padded
        reason = f"a packed pass with images failed ({type(err).__name__}: {err})"
    finally:
        model.train(was_training)
    if reason:
        logging.getLogger(__name__).warning(
            "Packing with images is off for %s: %s. Its passes with images run padded.", type(inner).__name__, reason
        )
    _images_checked[inner] = reason
    return reason


def _padded_logprobs(model: torch.nn.Module, *tokens: torch.Tensor) -> torch.Tensor:
    return completion_logprobs(model, *tokens)[0]


def _packed_logprobs(model: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
    return packed_completion_logprobs(model, packed, 1.0, False)[0]


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
    model: torch.nn.Module,
    forward,
    tokens: tuple[torch.Tensor, ...],
    batch_size: int,
    multiple_of: int | None = None,
    packing: bool = False,
    images: ImageBatch | None = None,
) -> torch.Tensor:
    """[N, C] ``forward(model, prompt_ids, prompt_mask, completion_ids, completion_mask)`` in eval mode over chunks
    of ``batch_size`` rows of ``tokens``: rows of similar length share a chunk (with ``packing``, consecutive rows:
    the completions of one prompt), and each chunk is trimmed to its own longest prompt and completion, rounded up
    to a multiple of ``multiple_of`` if given (the columns beyond a chunk's completions come back as 0). With
    ``images`` (a vision-language model's, [N] samples), each chunk's are passed as ``images=``."""
    was_training = model.training
    model.eval()
    prompt_mask, completion_mask = tokens[1], tokens[3]
    order = torch.argsort(prompt_mask.sum(1) * completion_mask.shape[1] + completion_mask.sum(1), stable=True)
    if packing:  # no padding to save, and a prompt's completions are consecutive
        order = torch.arange(len(prompt_mask))
    output = None
    for i in range(0, len(order), batch_size):
        rows = order[i : i + batch_size]
        chunk, width = trim_padding(*(tensor[rows] for tensor in tokens), multiple_of)
        extra = {} if images is None else {"images": images.select(rows)}
        values = forward(model, *chunk, **extra)  # [b, width]
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
    packing: bool = False,
    images: ImageBatch | None = None,
) -> torch.Tensor:
    """[N, C] ``completion_logprobs`` of (prompt_ids, prompt_mask, completion_ids, completion_mask) in eval mode,
    ``batch_size`` rows at a time, each chunk padded to a multiple of ``multiple_of`` columns if given, or packed."""

    def logprobs(model, *rows, images=None):
        return completion_logprobs(model, *rows, temperature=temperature, packing=packing, images=images)[0]

    return batched_forward(model, logprobs, tensors, batch_size, multiple_of, packing, images)
