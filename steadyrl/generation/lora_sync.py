"""Adapter-only weight sync of a LoRA actor to vLLM (``vllm_lora_sync``).

vLLM serves LoRA adapters itself (``enable_lora``): x W^T + scale x (x A^T) B^T, as PEFT computes it in training. A
LoRA run whose adapter vLLM can serve therefore pushes the frozen base weights once, when the engine starts, and
after each update only the adapter (A and B of each adapted layer), used through a new ``LoRARequest`` per weight
version, the previous one removed. Merged sync (``W + scale x BA`` for every adapted matrix, with every other weight)
stays for what vLLM's LoRA cannot serve; ``vllm_lora_sync='auto'`` falls back to it with one log line saying why.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

import torch

from ..models.peft import is_peft
from ..ops.finite import refuse_nonfinite

logger = logging.getLogger(__name__)

# The decoder projections vLLM's LoRA layers adapt in the Llama, Qwen and Mistral families (its linear layers,
# q/k/v and gate/up fused); anything else (embeddings, lm_head, other architectures' names) goes merged.
SERVABLE_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks (vLLM 0.32)
# measured on SmolLM2-135M, r=16 on every projection: bench/lora_sync_bytes.py, in BENCHMARKS.md
CPU_COST = (
    "vLLM runs on the CPU, where its LoRA kernels generated 5x slower than merged weights, which costs more "
    "than the merged push saves; set vllm_lora_sync='adapter' to push the adapter only anyway"
)
ADAPTER_CONFIG_KEY = "adapter_config"  # the safetensors metadata entry holding adapter_config.json


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The LoRA layers of a PEFT model, by their name in the base model."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.get_base_model().named_modules() if isinstance(module, LoraLayer)}


def adapter_rank(model: torch.nn.Module) -> int:
    """The largest LoRA rank of ``model``'s adapter (``r`` and ``rank_pattern``)."""
    config = next(iter(model.peft_config.values()))
    return max([config.r, *(config.rank_pattern or {}).values()])


def adapter_problem(model: torch.nn.Module, max_rank: int | None = None) -> str | None:
    """Why vLLM cannot serve ``model``'s LoRA adapter (None: it can), ``max_rank`` the largest rank it takes."""
    if not is_peft(model):
        return "the actor has no LoRA adapter"
    if len(model.peft_config) != 1:
        return f"the actor has {len(model.peft_config)} adapters ({sorted(model.peft_config)}), vLLM serves one"
    config = next(iter(model.peft_config.values()))
    if getattr(config, "modules_to_save", None):
        return f"modules_to_save={sorted(config.modules_to_save)} trains whole modules, which vLLM's LoRA does not"
    if getattr(config, "target_parameters", None):
        return f"target_parameters={config.target_parameters} adapts parameters, vLLM's LoRA adapts linear layers"
    if getattr(config, "layer_replication", None):
        return "layer_replication is not supported by vLLM's LoRA"
    layers = lora_layers(model)
    if any(layer.merged for layer in layers.values()):
        return "its adapter is merged into the base weights (merge_adapter)"
    modules = sorted({name.rsplit(".", 1)[-1] for name in layers} - SERVABLE_MODULES)
    if modules:
        return f"LoRA on {modules}, which steadyrl does not serve as a vLLM adapter (only {sorted(SERVABLE_MODULES)})"
    rank, limit = adapter_rank(model), max_rank or VLLM_MAX_LORA_RANKS[-1]
    if rank > limit:
        return f"rank {rank} is above the {limit} vLLM allows" + (" (the server's --max-lora-rank)" if max_rank else "")
    return None


def choose_sync(mode: str, model: torch.nn.Module, on_cpu: bool = False) -> str:
    """``'adapter'`` or ``'merged'`` for ``vllm_lora_sync=mode``, this actor and a vLLM on the CPU or not; 'auto'
    logs why it falls back."""
    if mode == "merged" or not is_peft(model):
        return "merged"
    problem = adapter_problem(model)
    if problem is None:
        if mode == "auto" and on_cpu:
            logger.info("vllm_lora_sync='auto': pushing merged weights to vLLM, not the adapter only: %s.", CPU_COST)
            return "merged"
        return "adapter"
    if mode == "adapter":
        raise ValueError(
            f"vllm_lora_sync='adapter' cannot be served: {problem}. Use vllm_lora_sync='auto' or 'merged' (merged "
            "weights after each update), or a LoraConfig on the attention and MLP projections only."
        )
    logger.info("vllm_lora_sync='auto': pushing merged weights to vLLM, not the adapter only: %s.", problem)
    return "merged"


def engine_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    return next(allowed for allowed in VLLM_MAX_LORA_RANKS if allowed >= rank)


@contextlib.contextmanager
def gathered_adapter(model: torch.nn.Module) -> Iterator[None]:
    """Under DeepSpeed ZeRO-3, the adapter's partitioned parameters gathered for the block (not the base's)."""
    params = [p for name, p in model.named_parameters() if "lora_" in name and hasattr(p, "ds_id")]
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        yield


@torch.no_grad()
def adapter_state(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict]:
    """The active adapter as PEFT saves it: ``base_model.model.<layer>.lora_{A,B}.weight`` (CPU copies) and its
    ``adapter_config.json``. The base weights it applies to are pushed separately, so the config states a plain
    initialisation (vLLM refuses PiSSA-like ones, which change the base weights: those are already in the base)."""
    name = next(iter(model.peft_config))
    with gathered_adapter(model):
        tensors = {
            f"base_model.model.{path}.lora_{part}.weight": getattr(layer, f"lora_{part}")[name].weight.detach().clone()
            for path, layer in lora_layers(model).items()
            if name in layer.lora_A
            for part in ("A", "B")
        }
    tensors = {key: tensor.cpu().contiguous() for key, tensor in tensors.items()}
    refuse_nonfinite(tensors.items(), "Refused to push the actor's LoRA adapter to vLLM")
    config = model.peft_config[name].to_dict()
    config.update(init_lora_weights=True, base_model_name_or_path=None, inference_mode=True)
    return tensors, json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def adapter_bytes(tensors: dict[str, torch.Tensor], config: dict) -> bytes:
    """One safetensors blob: the adapter's tensors, its config in the metadata (what the server's route takes)."""
    from safetensors.torch import save

    return save(tensors, metadata={ADAPTER_CONFIG_KEY: json.dumps(config)})


def write_adapter(directory: str, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """``directory/adapter_model.safetensors`` and ``adapter_config.json``, as PEFT writes an adapter."""
    import os

    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    with open(os.path.join(directory, "adapter_config.json"), "w") as file:
        json.dump(config, file)
