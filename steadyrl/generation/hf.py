"""Rollout generation with ``model.generate`` from transformers."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from ..vision import ImageBatch, computes_own_positions
from .base import Capabilities, Generation, GenerationBackend, trim_completion
from .seeded_sampling import seeded_generation
from .shared_prefill import generate_rows, left_pad, prefilled_cache


class HFGenerationBackend(GenerationBackend):
    """Samples with the training model itself, each completion from its own seed (seeded_sampling.py)."""

    capabilities = Capabilities(runs_training_model=True, takes_images=True)
    suppressed: tuple[int, ...] = ()  # token ids never sampled (a vision-language model's image tokens)

    def generation_config(self) -> GenerationConfig:
        s, tok = self.settings, self.tokenizer
        settings = dict(
            do_sample=True,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,  # 0: no top-k (None would let transformers fill in its default of 50)
            min_p=s.min_p,
            repetition_penalty=s.repetition_penalty,
            cache_implementation=s.cache_implementation,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        if self.suppressed:  # a sampled image token would have no image features to stand for
            settings["suppress_tokens"] = list(self.suppressed)
        return GenerationConfig(**{**settings, **s.extra})  # generation_kwargs override, as in TRL

    @torch.no_grad()
    def generate(
        self, model: torch.nn.Module, prompt_ids: list[list[int]], seeds: list[int], images: ImageBatch | None = None
    ) -> Generation:
        """All rows in one ``generate`` call, left-padded to the longest prompt, each sampled from its seed; rows that
        repeat a prompt (a group's samples) share its KV cache, computed once (``shared_prefill``), except with
        ``images`` (the rows' image inputs), which each row's prompt pass encodes, and for models whose positions come
        from the images (Qwen's mrope keeps the last call's position offsets, which a prefilled cache would read)."""
        if not prompt_ids:
            return Generation([])
        tok, device = self.tokenizer, next(model.parameters()).device
        config = self.generation_config()
        input_ids, attention_mask = left_pad(prompt_ids, tok.pad_token_id, device)
        seeded = seeded_generation(config, seeds, device, attention_mask)
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():  # the ids leave as Python lists: nothing here needs autograd's bookkeeping
                if images is None and not computes_own_positions(model):
                    cache, extra = prefilled_cache(model, config, prompt_ids, tok.pad_token_id), None
                elif images is None:  # Qwen's mrope: a prefilled cache would be read with the last call's offsets
                    cache, extra = None, None
                else:
                    cache, extra = None, images.to(device).model_inputs(input_ids.shape[1], 0)
                output = generate_rows(model, input_ids, attention_mask, config, cache, seeded, extra)
        finally:
            model.train(was_training)
        width = input_ids.shape[1]
        return Generation([trim_completion(row, tok.eos_token_id) for row in output[:, width:].tolist()])
