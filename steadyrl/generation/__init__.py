"""Generation backends behind one interface."""

from __future__ import annotations

import torch

from .base import Generation, GenerationBackend, SamplingSettings, sampling_seed
from .hf import HFGenerationBackend
from .vllm import EngineSettings, VLLMGenerationBackend, check_servable, import_vllm
from .weights import base_config, check_mergeable

__all__ = [
    "EngineSettings",
    "Generation",
    "GenerationBackend",
    "HFGenerationBackend",
    "SamplingSettings",
    "VLLMGenerationBackend",
    "make_backend",
    "sampling_seed",
]


def make_backend(args, tokenizer, model, device: torch.device, logprob_temperature: float) -> GenerationBackend:
    """The generation backend an ``OnPolicyConfig`` asks for, with every check that can fail before training."""
    settings = SamplingSettings(
        max_new_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        extra=dict(args.generation_kwargs or {}),
        cache_implementation=args.cache_implementation,
    )
    if not args.use_vllm:
        return HFGenerationBackend(tokenizer, settings)
    if args.cache_implementation is not None:
        raise ValueError(
            f"cache_implementation={args.cache_implementation!r} is for transformers' generate; with use_vllm=True "
            "vLLM manages its own KV cache. Leave cache_implementation unset, or use_vllm=False."
        )
    import_vllm()
    check_mergeable(model)
    config = base_config(model)
    check_servable(config, device)
    needed = args.max_prompt_length + args.max_completion_length
    max_model_len = args.vllm_max_model_len or min(needed, getattr(config, "max_position_embeddings", needed))
    engine = EngineSettings(
        max_model_len=max_model_len,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        tensor_parallel_size=args.vllm_tensor_parallel_size,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch.")
        if args.vllm_dtype == "auto"
        else args.vllm_dtype,
        enable_sleep_mode=args.vllm_enable_sleep_mode,
        kv_cache_space=args.vllm_kv_cache_space,
        seed=args.seed,
        # vLLM reports log-probs after temperature ("processed") or before it ("raw"): pick what the trainer uses
        logprobs_mode="processed_logprobs" if logprob_temperature == args.temperature else "raw_logprobs",
        world_size=args.world_size,
    )
    return VLLMGenerationBackend(tokenizer, settings, engine, device)
