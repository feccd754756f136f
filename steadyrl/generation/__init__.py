"""Generation backends behind one interface."""

from __future__ import annotations

import torch

from ..models.peft import base_config
from .base import Generation, GenerationBackend, SamplingSettings, sampling_seed
from .hf import HFGenerationBackend
from .lora_sync import adapter_rank, choose_sync, engine_rank
from .server_client import VLLMServerError
from .vllm import EngineSettings, VLLMGenerationBackend, check_servable, import_vllm
from .vllm_server import VLLMServerBackend, server_settings
from .weights import check_mergeable

__all__ = [
    "EngineSettings",
    "Generation",
    "GenerationBackend",
    "HFGenerationBackend",
    "SamplingSettings",
    "VLLMGenerationBackend",
    "VLLMServerBackend",
    "VLLMServerError",
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
    check_mergeable(model)
    # server mode: the server's device is checked when it answers (served_adapter_rank)
    on_cpu = device.type == "cpu" and args.vllm_mode != "server"
    adapter_only = choose_sync(args.vllm_lora_sync, model, on_cpu) == "adapter"
    config = base_config(model)
    needed = args.max_prompt_length + args.max_completion_length
    max_model_len = args.vllm_max_model_len or min(needed, getattr(config, "max_position_embeddings", needed))
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.") if args.vllm_dtype == "auto" else args.vllm_dtype
    # vLLM reports log-probs after temperature ("processed") or before it ("raw"): pick what the trainer uses
    logprobs_mode = "processed_logprobs" if logprob_temperature == args.temperature else "raw_logprobs"
    if args.vllm_mode == "server":
        server = server_settings(args, config, max_model_len, dtype, logprobs_mode)
        server.adapter_rank = adapter_rank(model) if adapter_only else None
        server.adapter_required = args.vllm_lora_sync == "adapter"
        return VLLMServerBackend(tokenizer, settings, server)
    import_vllm()
    check_servable(config, device)
    engine = EngineSettings(
        max_model_len=max_model_len,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        tensor_parallel_size=args.vllm_tensor_parallel_size,
        dtype=dtype,
        enable_sleep_mode=args.vllm_enable_sleep_mode,
        kv_cache_space=args.vllm_kv_cache_space,
        seed=args.seed,
        logprobs_mode=logprobs_mode,
        world_size=args.world_size,
        lora_rank=engine_rank(adapter_rank(model)) if adapter_only else None,
    )
    return VLLMGenerationBackend(tokenizer, settings, engine, device)
