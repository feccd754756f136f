"""The actor's weights as an inference engine needs them: plain Hugging Face names, whole tensors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..distributed.fsdp import full_state_dict, is_sharded
from ..models.peft import fsdp2_whole_parameters, is_peft


def check_mergeable(model: torch.nn.Module) -> None:
    """Refuse PEFT methods whose adapters ``plain_state_dict`` cannot merge (all but plain LoRA: not DoRA, not
    lora_bias)."""
    if not is_peft(model):
        return
    kinds = {str(getattr(config, "peft_type", "?")).split(".")[-1] for config in model.peft_config.values()}
    if kinds != {"LORA"}:
        raise ValueError(
            f"use_vllm=True pushes the actor with its adapters merged, which steadyrl supports for LoRA only; "
            f"this model's adapters are {sorted(kinds)}. Use a LoraConfig, or use_vllm=False."
        )
    variants = sorted(
        {
            f"{option}=True"
            for config in model.peft_config.values()
            for option in ("use_dora", "lora_bias")
            if getattr(config, option, False)
        }
    )
    if variants:
        raise ValueError(
            f"use_vllm=True pushes the actor with its LoRA adapters merged as W + scale x BA; {', '.join(variants)} "
            "merges otherwise (DoRA rescales each weight by a learned magnitude, lora_bias adapts the biases too), "
            "which steadyrl does not merge for vLLM. Use a LoraConfig without it, or use_vllm=False."
        )


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Under DeepSpeed ZeRO-3, gather the partitioned parameters on every rank for the duration; else nothing."""
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not partitioned:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned):
        yield


@torch.no_grad()
def plain_state_dict(
    model: torch.nn.Module, adapted_to: torch.device | str | None = None, merged: bool = True
) -> dict[str, torch.Tensor]:
    """``model``'s weights under the names of the plain Hugging Face model (with ``merged=False``, a LoRA model's
    base weights, without its adapters: what vLLM applies an adapter to).

    For a PEFT LoRA model, what ``merge_and_unload().state_dict()`` holds, without changing the model: each adapted
    weight is ``W + delta`` of its active adapters (added in PEFT's order), computed aside, one at a time (moved to
    ``adapted_to`` if given); every other weight is the live tensor itself. The training model's own tensors are
    never modified (merging in place and unmerging would not restore them bit for bit), and no random number is
    drawn. Call it inside ``gathered(model)`` under ZeRO-3.
    """
    if not is_peft(model):
        return dict(model.state_dict())
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted = {
        f"{name}.base_layer.weight": module
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and not module.merged and not module.disable_adapters
    }
    state = {}
    for key, value in base.state_dict().items():
        if "lora_" in key or ".original_module." in key:
            continue
        name = key.replace(".base_layer.", ".")
        for adapter in model.peft_config:
            name = name.replace(f".modules_to_save.{adapter}.", ".")
        if merged and (layer := adapted.get(key)) is not None:
            for adapter in (a for a in layer.active_adapters if a in layer.lora_A):
                value = value + layer.get_delta_weight(adapter)
            value = value if adapted_to is None else value.to(adapted_to)
        state[name] = value
    return state


@contextlib.contextmanager
def whole_weights(
    model: torch.nn.Module, everywhere: bool = True, merged: bool = True
) -> Iterator[dict[str, torch.Tensor] | None]:
    """``plain_state_dict(model, merged=merged)`` with every weight whole for the block: ZeRO-3 partitions gathered
    on every process, FSDP2 shards gathered one tensor at a time (merged; with ``everywhere=False`` on the main
    process only, None on the others). Every process must enter it."""
    if is_sharded(model):
        if is_peft(model):  # a LoRA actor merged from its whole weights (on every process)
            with fsdp2_whole_parameters(model):
                yield plain_state_dict(model, merged=merged)
            return
        yield full_state_dict(model, everywhere)
        return
    with gathered(model):
        yield plain_state_dict(model, merged=merged)
