"""Generation backends behind one interface, registered by name.

A backend is a ``GenerationBackend`` subclass that declares its ``capabilities`` and builds itself from a config
(``from_config``); ``BACKENDS`` maps the name a config picks (``OnPolicyConfig.generation_backend``: 'hf',
'vllm_colocate', 'vllm_server', or TRL's use_vllm / vllm_mode resolved onto one of them) to its class. Adding a backend
is one class and one line in ``BACKENDS``, made before the config that names it is built.
"""

from __future__ import annotations

import torch

from .base import Capabilities, Generation, GenerationBackend, SamplingSettings, sampling_seed
from .hf import HFGenerationBackend
from .server_client import VLLMServerError
from .vllm import EngineSettings, VLLMGenerationBackend
from .vllm_server import VLLMServerBackend

__all__ = [
    "BACKENDS",
    "Capabilities",
    "EngineSettings",
    "Generation",
    "GenerationBackend",
    "HFGenerationBackend",
    "SamplingSettings",
    "VLLMGenerationBackend",
    "VLLMServerBackend",
    "VLLMServerError",
    "backend_class",
    "make_backend",
    "not_registered",
    "sampling_seed",
]

BACKENDS: dict[str, type[GenerationBackend]] = {
    "hf": HFGenerationBackend,  # transformers' generate, with the training model
    "vllm_colocate": VLLMGenerationBackend,  # a vLLM engine in each training process
    "vllm_server": VLLMServerBackend,  # a running vLLM server
}


def not_registered(name: object) -> str | None:
    """Why ``name`` names no registered backend (it lists the registered ones), or None when it does."""
    if isinstance(name, str) and name in BACKENDS:
        return None
    registered = ", ".join(sorted(BACKENDS))
    return f"no generation backend is registered as {name!r}: steadyrl.generation.BACKENDS holds {registered}"


def backend_class(name: str) -> type[GenerationBackend]:
    """The backend class registered as ``name``."""
    problem = not_registered(name)
    if problem:
        raise ValueError(f"{problem}.")
    return BACKENDS[name]


def make_backend(args, tokenizer, model, device: torch.device, logprob_temperature: float) -> GenerationBackend:
    """The generation backend an ``OnPolicyConfig`` names (``args.generation_backend``), built with every check
    that can fail before training."""
    return backend_class(args.generation_backend).from_config(args, tokenizer, model, device, logprob_temperature)
