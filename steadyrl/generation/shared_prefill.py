"""HF generate with each distinct prompt prefilled once.

GRPO and RLOO send a prompt's ``n_samples_per_prompt`` completions as identical rows. ``prefilled_cache`` runs one
forward over the distinct prompts (left-padded, all but the last token), copies each prompt's KV cache to its rows,
and ``generate_rows`` hands that cache to the one ``model.generate`` call, which then computes only each row's last
prompt token before decoding. Wherever sharing does not apply or is unsafe (no repeated prompt, a configured or
non-dynamic cache, beams, a ``generate`` that refuses a cache) it says why once and generate prefills every row.
"""

from __future__ import annotations

import logging
import weakref

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList
from transformers.cache_utils import DynamicLayer

logger = logging.getLogger(__name__)
_said: set[str] = set()
_refused: weakref.WeakSet = weakref.WeakSet()  # models whose generate refused a prefilled cache


def _say_once(key: str, message: str, level: int = logging.INFO) -> None:
    if key not in _said:
        _said.add(key)
        logger.log(level, "HF generate prefills every row, not each distinct prompt once: %s", message)


def left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` left-padded to the longest: the ids and the attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


def distinct_prompts(rows: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct rows in order of first appearance, and each row's index among them."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(r), len(first)) for r in rows]
    return [list(r) for r in first], index


def _why_not(model: torch.nn.Module, config: GenerationConfig, rows: int, distinct: int, width: int) -> str | None:
    """Why these rows cannot share a prefilled cache, as ``"key: reason"`` (said once per key); None: they can."""
    own = getattr(getattr(model, "generation_config", None), "cache_implementation", None)
    if distinct == rows:
        return "no-repeat: no prompt is repeated, nothing to share"
    if width < 2:
        return "short: every prompt is one token, nothing to prefill"
    if config.cache_implementation or own:
        return f"cache: cache_implementation={config.cache_implementation or own!r} builds its own cache"
    if config.get_generation_mode() not in ("greedy_search", "sample") or (config.num_return_sequences or 1) > 1:
        return "mode: only greedy decoding and sampling, without num_return_sequences, share a prompt's cache"
    if config.use_cache is False or config.prefill_chunk_size is not None or getattr(model, "_is_stateful", False):
        return "no-cache: use_cache=False, prefill_chunk_size, or a stateful (recurrent) model"
    if model in _refused:
        return "refused: this model's generate refused a prefilled cache before"
    return None


def prefilled_cache(
    model: torch.nn.Module, config: GenerationConfig, prompt_ids: list[list[int]], pad_id: int
) -> DynamicCache | None:
    """The KV cache of every row's prompt but its last token, each distinct prompt computed once; None (and why,
    once) where the rows cannot share it."""
    distinct, index = distinct_prompts(prompt_ids)
    width = max(len(p) for p in prompt_ids)
    reason = _why_not(model, config, len(prompt_ids), len(distinct), width)
    if reason is not None:
        _say_once(*reason.split(": ", 1))
        return None
    device = next(model.parameters()).device
    ids, mask = left_pad(distinct, pad_id, device)
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate computes them
    extra = {"logits_to_keep": 1} if getattr(model, "_supports_logits_to_keep", lambda: False)() else {}
    out = model(ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids[:, :-1], use_cache=True, **extra)
    cache = getattr(out, "past_key_values", None)
    plain = type(cache) is DynamicCache and not getattr(cache, "offloading", False)
    if not plain or not all(type(layer) is DynamicLayer for layer in cache.layers):
        _say_once("layers", f"the model's cache is {type(cache).__name__} (sliding-window, hybrid or recurrent)")
        return None
    rows = torch.tensor(index, device=device)
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
    return cache


def generate_rows(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config: GenerationConfig,
    cache: DynamicCache | None,
    seeded: tuple[GenerationConfig, LogitsProcessorList] | None = None,
    extra: dict | None = None,
) -> torch.Tensor:
    """One ``model.generate`` call over all rows with ``config``, from ``cache`` if given, each row drawn from its
    seed with ``seeded`` (the config and processors of seeded_sampling.py: the per-row sampler, the repetition
    penalty over each row's own tokens) if given. A ``generate`` that
    refuses the cache (a wrapper's) is called again without it, from the same RNG state, and is not given one again;
    one that refuses the sampler samples with ``config`` from the global RNG. ``extra``: more model inputs (a
    vision-language model's image inputs)."""
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, generation_config=config, **(extra or {}))
    if seeded is not None:
        kwargs.update(generation_config=seeded[0], logits_processor=seeded[1])
    if cache is not None:
        cuda = input_ids.device.type == "cuda"
        rng = torch.random.get_rng_state(), torch.cuda.get_rng_state(input_ids.device) if cuda else None
        try:
            return model.generate(**kwargs, past_key_values=cache)
        except (TypeError, ValueError) as error:
            _refused.add(model)
            _say_once("refused", f"{type(model).__name__}.generate refused a prefilled cache: {error}", logging.WARNING)
            torch.random.set_rng_state(rng[0])
            if cuda:
                torch.cuda.set_rng_state(rng[1], input_ids.device)
    if seeded is not None:
        try:
            return model.generate(**kwargs)
        except TypeError as error:
            if "logits_processor" not in str(error):
                raise
            logger.warning(
                "%s.generate takes no logits_processor: it samples from the global RNG, not from each completion's "
                "seed.",
                type(model).__name__,
            )
            kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, generation_config=config, **(extra or {}))
    return model.generate(**kwargs)
