"""HF generate sampling each completion from its own seed, as vLLM does.

``model.generate`` samples every row from the global torch RNG, so a completion depends on which rows share its
``generate`` call and on what drew from the RNG before: on how a rollout is split over processes and generate calls.
Here each row draws from a generator seeded with its completion's sampling seed (``base.sampling_seed``: run seed,
rollout, prompt, sample), so a completion is the same however the rollout is split, as with vLLM's per-request seeds.

It runs as the last logits processor of a greedy ``generate``: it applies the sampling warpers ``generate`` would
(temperature, top-k, top-p, min-p, with transformers' own warper classes, in transformers' order), draws each row's
token from its generator and leaves only that token's score finite, which greedy decoding then picks. Settings it
cannot reproduce (other warpers, beams, several sequences per prompt) keep ``generate``'s own sampling, said once.

``repetition_penalty`` is applied here too, over each row's own tokens (its prompt and its completion so far), not
the left padding before a shorter prompt, as vLLM penalises prompt and output tokens: transformers' processor also
penalises the pad id, which is EOS for a tokenizer without a pad token, so a row's logits depended on the longer
prompts beside it.
"""

from __future__ import annotations

import logging

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

logger = logging.getLogger(__name__)
_said: set[str] = set()

# generate's sampling settings this module does not apply: with any of them set, generate samples itself
OTHER_WARPERS = ("top_h", "typical_p", "epsilon_cutoff", "eta_cutoff", "watermarking_config")


class SeededSampler(LogitsProcessor):
    """Scores [B, V] -> the same shape, -inf but at one token per row, drawn from that row's own generator after
    ``warpers``. Row i of every call is the same completion (``generate`` keeps its rows in place)."""

    def __init__(self, seeds: list[int], warpers: list[LogitsProcessor], device: torch.device) -> None:
        self.generators = [torch.Generator(device).manual_seed(seed) for seed in seeds]
        self.warpers = warpers

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        probs = torch.softmax(scores.float(), dim=-1)
        tokens = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, self.generators, strict=True)])
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)


class RealTokenRepetitionPenalty(LogitsProcessor):
    """transformers' repetition penalty over each row's real tokens: ``prompt_mask`` [B, P] (0 on left padding) marks
    the prompt's, and every generated column counts. Padding is given the id ``V``, which transformers' processor
    drops (vLLM pads its prompt tokens the same way), so the arithmetic is transformers' own."""

    def __init__(self, penalty: float, prompt_mask: torch.Tensor) -> None:
        self.penalty = RepetitionPenaltyLogitsProcessor(penalty=float(penalty))
        self.prompt_mask = prompt_mask.bool()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, width = input_ids.shape
        mask = self.prompt_mask.to(input_ids.device)
        mask = mask.repeat_interleave(rows // mask.shape[0], dim=0)  # beams and return sequences: rows expanded
        generated = mask.new_ones(rows, width - mask.shape[1])
        real = torch.cat([mask, generated], dim=1)
        return self.penalty(input_ids.masked_fill(~real, scores.shape[-1]), scores)


def warpers_of(config: GenerationConfig) -> list[LogitsProcessor]:
    """The sampling warpers ``generate`` builds for ``config``, in its order (one sequence per prompt, no beams)."""
    warpers: list[LogitsProcessor] = []
    if config.temperature is not None and config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k is not None and config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p))
    if config.min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=config.min_p))
    return warpers


def why_not_seeded(config: GenerationConfig) -> str | None:
    """Why ``config``'s sampling cannot be drawn per row here; None if it can."""
    if not config.do_sample:
        return "greedy"  # nothing is drawn
    other = [name for name in OTHER_WARPERS if getattr(config, name, None) not in (None, 1.0)]
    other = [name for name in other if not (name.endswith("cutoff") and not 0.0 < getattr(config, name) < 1.0)]
    if other:
        return f"generation_kwargs set {', '.join(other)}, which are applied by generate's own sampling only"
    if (config.num_beams or 1) > 1 or (config.num_return_sequences or 1) > 1:
        return "beam search or num_return_sequences > 1"
    return None


def seeded_generation(
    config: GenerationConfig, seeds: list[int], device: torch.device, prompt_mask: torch.Tensor | None = None
) -> tuple[GenerationConfig, LogitsProcessorList] | None:
    """The config and logits processors to pass to ``generate``: ``config`` made greedy with the per-row sampler
    last, and its ``repetition_penalty`` applied over each row's real tokens (``prompt_mask`` [B, P], the prompts'
    attention mask; None: no padding). None (and why, once) where ``generate`` must sample itself with ``config``
    as it is."""
    penalty = config.repetition_penalty not in (None, 1.0)
    mask = prompt_mask if prompt_mask is not None else torch.ones(len(seeds), 1, dtype=torch.bool, device=device)
    processors = LogitsProcessorList([RealTokenRepetitionPenalty(config.repetition_penalty, mask)] if penalty else [])
    unpenalised = {**config.to_dict(), "repetition_penalty": 1.0}
    reason = why_not_seeded(config)
    if reason is not None:
        if reason != "greedy" and reason not in _said:
            _said.add(reason)
            logger.warning("HF generate samples from the global RNG, not from each completion's seed: %s.", reason)
        return (GenerationConfig.from_dict(unpenalised), processors) if penalty else None
    processors.append(SeededSampler(seeds, warpers_of(config), device))
    greedy = GenerationConfig.from_dict(
        {**unpenalised, "do_sample": False, "temperature": 1.0, "top_k": None, "top_p": 1.0, "min_p": None}
    )
    return greedy, processors
