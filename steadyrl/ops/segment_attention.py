"""Attention over a packed row that computes only the pairs the packing needs.

A packed row's [T, T] mask (packing.py) is mostly zeros: a completion sees its prompt and its own earlier tokens,
never another completion. SDPA with that mask still computes every pair. Here each span gets its own SDPA call
instead: a prompt attends causally to itself, and each completion's queries [c] attend to its prompt's keys and its
own [P + c], under a mask that is causal along the completion. The pairs computed fall from T² to about
P² + sum(c * (P + c)) per group.

It is reached through transformers' attention interface: ``install()`` wraps the registered "sdpa" function, and the
wrapper takes this path only when a forward is given ``SEGMENTS_KWARG`` (which transformers passes down to each
attention call, gradient checkpointing's recompute included); every other call goes to the original unchanged. A
model whose attention does not read the interface ignores the keyword and runs on the packed mask, which gives the
same results.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .head_logprobs import unwrapped

SEGMENTS_KWARG = "packed_segments"


@dataclass
class Span:
    """A prompt's positions [start, end) in its packed row, and its completions' [start, end) spans after it."""

    start: int
    end: int
    completions: list[tuple[int, int]]


@dataclass
class PackedSegments:
    """Which spans of each packed row attend to what; the masks are built once per pass, on the rows' device."""

    rows: list[list[Span]]  # per packed row, its groups in order
    width: int  # T
    device: torch.device
    _masks: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)

    def completion_mask(self, prompt: int, length: int) -> torch.Tensor:
        """[c, P + c] bool: every prompt key, and the completion's keys up to the query's own position."""
        key = (prompt, length)
        if key not in self._masks:
            steps = torch.arange(length, device=self.device)
            own = steps[:, None] >= steps[None, :]
            self._masks[key] = torch.cat([own.new_ones(length, prompt), own], 1)
        return self._masks[key]


def segment_attention(
    segments: PackedSegments, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling, dropout: float
) -> torch.Tensor:
    """query [R, H, T, D], key/value [R, H_kv, T, D] -> [R, T, H, D], the packed mask's attention span by span (a
    padding position's output is 0: no query attends to it)."""
    if key.shape[1] != query.shape[1]:
        repeats = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(repeats, 1), value.repeat_interleave(repeats, 1)

    def attend(q, k, v, mask=None):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=mask is None
        )

    rows = []
    for r, spans in enumerate(segments.rows):
        q, k, v = query[r : r + 1], key[r : r + 1], value[r : r + 1]
        pieces, end = [], 0
        for span in spans:
            prompt = slice(span.start, span.end)
            pieces.append(attend(q[:, :, prompt], k[:, :, prompt], v[:, :, prompt]))
            for start, stop in span.completions:
                if stop == start:
                    continue
                keys = torch.cat([k[:, :, prompt], k[:, :, start:stop]], 2)
                values = torch.cat([v[:, :, prompt], v[:, :, start:stop]], 2)
                mask = segments.completion_mask(span.end - span.start, stop - start)
                pieces.append(attend(q[:, :, start:stop], keys, values, mask))
            end = max([span.end, *(stop for _, stop in span.completions)])
        if end < segments.width:
            pieces.append(q.new_zeros(*q.shape[:2], segments.width - end, q.shape[3]))
        rows.append(torch.cat(pieces, 2))
    return torch.cat(rows, 0).transpose(1, 2).contiguous()


# keywords of an attention call that this path does not implement: such calls go to SDPA with the mask
UNSUPPORTED = ("position_bias", "cache", "s_aux", "sliding_window", "softcap")


def _sdpa_with_segments(module, query, key, value, attention_mask, *args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments = kwargs.pop(SEGMENTS_KWARG, None)
    plain = not args and all(kwargs.get(name) is None for name in UNSUPPORTED)
    causal = kwargs.get("is_causal") is not False and getattr(module, "is_causal", True) is not False
    if segments is None or not plain or not causal:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    return segment_attention(segments, query, key, value, kwargs.get("scaling"), kwargs.get("dropout", 0.0)), None


def install() -> bool:
    """Wrap transformers' own "sdpa" attention where it is the registered one (calls without ``SEGMENTS_KWARG`` pass
    through unchanged); whether "sdpa" now takes spans. An "sdpa" registered by someone else is left alone."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    if AttentionInterface._global_mapping["sdpa"] is sdpa_attention_forward:
        AttentionInterface.register("sdpa", _sdpa_with_segments)
    return AttentionInterface._global_mapping["sdpa"] is _sdpa_with_segments


def takes_segments(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward passes extra keywords on (to its attention): transformers' models do."""
    forward = unwrapped(model).forward
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
