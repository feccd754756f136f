"""Packed, shared-prompt passes: each token of a micro-batch computed once.

The padded pass runs [B, P + C]: prompts left-padded, completions right-padded, and a prompt computed again for each
of its completions. Packed, the same rows become [R, T]: each distinct prompt once, followed by the completions that
continue it, with no padding between them. A completion attends to its prompt and to its own earlier tokens, never to
another completion, and its position ids continue from its prompt's length, so each completion token sees what it
sees in the padded pass; a shared prompt's gradient is the sum of what each completion gives it. The padded layout
itself is built here too (``pad_prompts_and_completions``).

Shapes: B rows, C completion width, R packed rows, T packed width, K completion tokens (the completion mask's ones),
H hidden size, V vocabulary.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..vision import ImageBatch
from .head_logprobs import chunkable_head, head_returns_logprobs, unwrapped, warn_full_logits_once
from .logit_rows import CHUNK_HEAD_LOGITS, logprobs_from_logits, model_logits
from .segment_attention import SEGMENTS_KWARG, PackedSegments, Span, install, takes_segments

logger = logging.getLogger(__name__)

# Attention implementations that read a custom [R, 1, T, T] mask as it is: SDPA a boolean one, eager an additive one.
MASK_FORMATS = {"sdpa": "bool", "eager": "additive"}


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


@dataclass
class PackedRows:
    """A micro-batch's sequences packed into rows, and where each completion token's prediction comes from."""

    input_ids: torch.Tensor  # [R, T] long; the pad token after a row's last sequence
    position_ids: torch.Tensor  # [R, T] long: 0.. along a prompt, continuing along each of its completions
    segment: torch.Tensor  # [R, T] long: which prompt group of its row a token belongs to; -1 on padding
    branch: torch.Tensor  # [R, T] long: -1 on a prompt token (shared), else the batch row of its completion
    source: torch.Tensor  # [K] long: flat index (r * T + t) of the position whose output predicts each token
    targets: torch.Tensor  # [K] long: the completion tokens, in completion_mask's row-major order
    completion_mask: torch.Tensor  # [B, C] bool
    spans: list[list[Span]]  # per packed row, each group's prompt and completion spans (segment_attention.py)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # image inputs, each group's once, in packed order

    def attention_mask(self, mask_format: str = "bool", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[R, 1, T, T]: query t sees key s <= t of its own group that is a prompt token or in its own completion
        (padding sees the padding before it, so no query is without a key). ``additive``: 0 / the dtype's min."""
        width = self.input_ids.shape[1]
        steps = torch.arange(width, device=self.input_ids.device)
        causal = steps[None, :, None] >= steps[None, None, :]
        same_group = self.segment[:, :, None] == self.segment[:, None, :]
        key_branch = self.branch[:, None, :]
        visible = (key_branch == -1) | (key_branch == self.branch[:, :, None])
        mask = (causal & same_group & visible).unsqueeze(1)
        if mask_format == "bool":
            return mask
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)

    def model_inputs(self, mask_format: str = "bool", dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "attention_mask": self.attention_mask(mask_format, dtype),
            **self.extra,
        }

    def segments(self) -> PackedSegments:
        return PackedSegments(self.spans, self.input_ids.shape[1], self.input_ids.device)

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """[B, C, ...] with ``values`` [K, ...] at the completion tokens and 0 elsewhere (the padded layout)."""
        out = values.new_zeros((*self.completion_mask.shape, *values.shape[1:]))
        out[self.completion_mask] = values
        return out

    @property
    def positions(self) -> int:
        return self.input_ids.numel()


def pack_shared_prompts(
    prompt_ids: torch.Tensor,  # [B, P], left-padded
    prompt_mask: torch.Tensor,  # [B, P]
    completion_ids: torch.Tensor,  # [B, C], right-padded
    completion_mask: torch.Tensor,  # [B, C]
    pad_token_id: int = 0,
    multiple_of: int | None = None,
    images: ImageBatch | None = None,
    positions_of: Callable[[torch.Tensor, ImageBatch], torch.Tensor | None] | None = None,
) -> PackedRows:
    """The rows packed: rows with the same prompt (and the same images) form a group (the prompt once, then each row's
    completion); groups fill packed rows in order of first appearance, a row holding as many whole groups as fit in
    the longest group's length. With ``multiple_of``, T is rounded up to a multiple of it (TRL's
    ``pad_to_multiple_of``). ``images``: the rows' image inputs, each group's passed once (its vision tower runs once
    per group); ``positions_of(prompt [P], its images)``: [3, P] positions of a model whose positions come from the
    images (``vision.image_positions``), its completions continuing from the prompt's largest."""
    prompt_rows = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids.cpu(), prompt_mask.cpu())]
    lengths = completion_mask.sum(1).tolist()
    completions = completion_ids.tolist()
    image_keys = images.sample_keys() if images is not None else [b""] * len(prompt_rows)
    groups: dict[tuple, list[int]] = {}
    for row, prompt in enumerate(prompt_rows):
        groups.setdefault((tuple(prompt), image_keys[row]), []).append(row)
    sizes = [len(prompt) + sum(lengths[row] for row in rows) for (prompt, _), rows in groups.items()]
    budget = max(sizes)
    packed: list[list[tuple[tuple[int, ...], list[int]]]] = [[]]
    used = 0
    for ((prompt, _), rows), size in zip(groups.items(), sizes):
        if used + size > budget:
            packed.append([])
            used = 0
        packed[-1].append((prompt, rows))
        used += size
    width = budget if not multiple_of else -(-budget // multiple_of) * multiple_of
    ids, positions, segment, branch = ([[fill] * width for _ in packed] for fill in (pad_token_id, 0, -1, -1))
    start: dict[int, int] = {}  # a batch row -> flat index of its completion's first token
    prompt_last: dict[int, int] = {}  # a batch row -> flat index of its prompt's last token
    spans: list[list[Span]] = [[] for _ in packed]
    for r, row_groups in enumerate(packed):
        t = 0
        for g, (prompt, rows) in enumerate(row_groups):
            ids[r][t : t + len(prompt)] = prompt
            positions[r][t : t + len(prompt)] = range(len(prompt))
            segment[r][t : t + len(prompt)] = [g] * len(prompt)
            spans[r].append(Span(t, t + len(prompt), []))
            t += len(prompt)
            last = r * width + t - 1  # the prompt's last token predicts each completion's first
            for row in rows:
                n = lengths[row]
                ids[r][t : t + n] = completions[row][:n]
                positions[r][t : t + n] = range(len(prompt), len(prompt) + n)
                segment[r][t : t + n], branch[r][t : t + n] = [g] * n, [row] * n
                prompt_last[row], start[row] = last, r * width + t
                spans[r][-1].completions.append((t, t + n))
                t += n
    source = [
        prompt_last[row] if k == 0 else start[row] + k - 1
        for row in range(len(prompt_rows))
        for k in range(lengths[row])
    ]
    device = completion_ids.device
    mask = completion_mask.bool()

    def tensor(rows):
        return torch.tensor(rows, dtype=torch.long, device=device)

    position_ids, extra = tensor(positions), {}
    if images is not None:
        firsts = [rows[0] for row_groups in packed for _, rows in row_groups]
        position_ids, extra = packed_image_inputs(images, firsts, prompt_rows, position_ids, spans, positions_of)
    return PackedRows(
        input_ids=tensor(ids),
        position_ids=position_ids,
        segment=tensor(segment),
        branch=tensor(branch),
        source=tensor(source),
        targets=completion_ids[mask],
        completion_mask=mask,
        spans=spans,
        extra=extra,
    )


def packed_image_inputs(
    images: ImageBatch,
    firsts: list[int],
    prompt_rows: list[list[int]],
    position_ids: torch.Tensor,
    spans: list[list[Span]],
    positions_of,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The packed rows' image inputs: each group's image rows once (``firsts``: a batch row of each group, in packed
    order), its token-aligned inputs over its prompt's positions (0 elsewhere); and the position ids, [3, R, T] where
    ``positions_of`` gives a prompt's (its completions continue from the prompt's largest on all three)."""
    chosen = images.select(torch.tensor(firsts))
    extra = dict(chosen.rows)
    device = position_ids.device
    tokens = {name: torch.zeros_like(position_ids) for name in chosen.tokens}
    per_group = [(r, span) for r, row_spans in enumerate(spans) for span in row_spans]
    mrope = None
    for i, ((r, span), row) in enumerate(zip(per_group, firsts)):
        width = span.end - span.start
        one = chosen.select(slice(i, i + 1)).fit_prompt(width)
        for name, value in one.tokens.items():
            tokens[name][r, span.start : span.end] = value[0].to(device)
        if positions_of is None:
            continue
        prompt_positions = positions_of(torch.tensor(prompt_rows[row], device=device), one)
        if prompt_positions is None:
            continue
        if mrope is None:
            mrope = position_ids[None].repeat(3, 1, 1)
        mrope[:, r, span.start : span.end] = prompt_positions.to(device)
        following = int(prompt_positions.max()) + 1
        for start, end in span.completions:
            mrope[:, r, start:end] = torch.arange(following, following + end - start, device=device)
    return (position_ids if mrope is None else mrope), {**extra, **tokens}


def packing_support(model: torch.nn.Module) -> tuple[str | None, str]:
    """The attention-mask format ``model``'s attention reads (``MASK_FORMATS``), or None and why a packed pass cannot
    express its attention."""
    config = getattr(unwrapped(model), "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    implementation = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
    if implementation not in MASK_FORMATS:
        return None, (
            f"its attention implementation {implementation!r} takes no custom attention mask (packing runs with "
            f"attn_implementation 'sdpa' or 'eager')"
        )
    layer_types = getattr(text, "layer_types", None) or ()
    window = getattr(text, "sliding_window", None)
    if "sliding_attention" in layer_types or (window and not layer_types and getattr(text, "use_sliding_window", True)):
        return None, f"it uses sliding-window attention (sliding_window={window}), which a packed mask would drop"
    return MASK_FORMATS[implementation], ""


_packing_checked: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def packing_fallback(
    model: torch.nn.Module,
    tokens: tuple[torch.Tensor, ...],
    padded: Callable[..., torch.Tensor],
    packed: Callable[[torch.nn.Module, PackedRows], torch.Tensor],
    outputs: dict | None = None,
) -> str:
    """Why ``model``'s passes run padded, not packed ('' where packing applies). Checked once per model: its
    attention must take a packed mask (``packing_support``), and on a probe made from ``tokens``' first row (two
    groups in one packed row, one prompt shared by two completions) ``packed(model, rows)`` must equal
    ``padded(model, *tokens)`` [B, C] on the completion tokens. A Mixture-of-Experts pass whose load-balancing loss is
    asked for (``outputs``) runs padded."""
    if outputs is not None:
        return "its Mixture-of-Experts load-balancing loss is taken over the padded batch"
    inner = unwrapped(model)
    if inner not in _packing_checked:
        reason = packing_support(model)[1] or packing_probe(model, tokens, padded, packed)
        if reason:
            logger.warning("Packing is off for %s: %s. Its passes run padded.", type(inner).__name__, reason)
        _packing_checked[inner] = reason
    return _packing_checked[inner]


@torch.no_grad()
def packing_probe(model: torch.nn.Module, tokens: tuple[torch.Tensor, ...], padded, packed) -> str:
    """'' if a packed pass of a small probe equals the padded pass (eval mode: no dropout), else how far it is."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = tokens
    ids = torch.cat([prompt_ids[0][prompt_mask[0].bool()], completion_ids[0][completion_mask[0].bool()]])
    ids = ids.repeat(-(-8 // len(ids)))[:8].tolist()
    prompts = [ids, ids, ids[::-1][:3], ids[:2]]  # one prompt shared by two completions; two groups in one row
    completions = [ids[::-1][:4], ids[1:7], ids[2:6], ids[::-1][1:6]]
    probe = tuple(pad_prompts_and_completions(prompts, completions, 0, prompt_ids.device).values())
    was_training = model.training
    model.eval()
    try:
        expected = padded(model, *probe)
        try:
            gap = ((expected - packed(model, pack_shared_prompts(*probe))) * probe[3]).abs().max().item()
        except Exception as err:  # noqa: BLE001 - a model that cannot take the packed inputs: it runs padded
            return f"a packed pass failed ({type(err).__name__}: {err})"
    finally:
        model.train(was_training)
    tolerance = 1e-4 if next(unwrapped(model).parameters()).dtype == torch.float32 else 5e-2
    return "" if gap <= tolerance else f"a packed probe's results differ from the padded pass's by {gap:.2g}"


def packed_inputs(model: torch.nn.Module, packed: PackedRows) -> dict:
    """``packed``'s model inputs with the mask in the format ``model``'s attention reads, in its parameters' dtype;
    for SDPA also the spans, so that its attention computes only the pairs the mask keeps (segment_attention.py)."""
    dtype = next(unwrapped(model).parameters()).dtype
    mask_format = packing_support(model)[0] or "bool"
    inputs = packed.model_inputs(mask_format, dtype if dtype.is_floating_point else torch.float32)
    if mask_format == "bool" and takes_segments(model) and install():
        inputs[SEGMENTS_KWARG] = packed.segments()
    return inputs


def packed_completion_logprobs(
    model: torch.nn.Module, packed: PackedRows, temperature: float, with_entropy: bool, chunked_head: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``completion_logprobs`` of a packed micro-batch: log-probs [B, C] (and entropies) in the padded layout, 0 on
    padding. The LM head runs on the K predicting positions only: in chunks from the hidden states where the head
    allows it (head_logprobs.py), else on the [R, T, V] logits."""
    inputs = packed_inputs(model, packed)
    head, reason = chunkable_head(model) if chunked_head else (None, "")
    if head is not None:
        rows = max(1, CHUNK_HEAD_LOGITS // head.out_features)
        with head_returns_logprobs(head, packed.targets, temperature, with_entropy, rows, packed.source) as calls:
            output = model_logits(model, inputs, 0)  # [1, K, 1 or 2]: read from the output (hooks attach)
        if len(calls) == 1:
            output = output.reshape(len(packed.source), -1)
            return packed.scatter(output[:, 0]), packed.scatter(output[:, 1]) if with_entropy else None
        reason = f"its forward called its output embedding {len(calls)} times, not once"
    if reason:
        warn_full_logits_once(model, reason)
    logits = model_logits(model, inputs, 0)  # [R, T, V]
    picked = logits.reshape(-1, logits.shape[-1])[packed.source.to(logits.device)]  # [K, V]
    logprobs, entropy = logprobs_from_logits(picked[None], packed.targets[None], temperature, with_entropy)
    return packed.scatter(logprobs[0]), None if entropy is None else packed.scatter(entropy[0])


def packed_hidden_states(backbone: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
    """[K, H]: the last hidden states of ``backbone`` (a base model, no head) at the positions that predict each
    completion token, from one packed pass."""
    hidden = backbone(**packed_inputs(backbone, packed), use_cache=False).last_hidden_state
    return hidden.reshape(-1, hidden.shape[-1])[packed.source.to(hidden.device)]
