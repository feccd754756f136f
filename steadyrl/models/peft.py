"""PEFT (LoRA) models seen through their wrapper: whether a model is one, its base model's config, and its adapter's
parameters whole where DeepSpeed ZeRO-3 partitions or FSDP2 shards them (the frozen base stays as it is)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def base_config(model: torch.nn.Module):
    """The Hugging Face config of ``model``, or of the base model under a PEFT wrapper."""
    return (model.get_base_model() if is_peft(model) else model).config


def is_distributed_weights(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are ZeRO-3 partitions or FSDP2 shards (``DTensor``), not whole tensors."""
    return any(hasattr(p, "ds_id") or hasattr(p, "full_tensor") for p in model.parameters())


def trained_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """A PEFT model's trained parameters (its adapters, and ``modules_to_save``), by their live names."""
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


def saved_adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """A PEFT model's trained parameters by their names in ``adapter_model.safetensors`` (PEFT's
    ``get_peft_model_state_dict`` renames them; the tensors it returns are the parameters themselves)."""
    from peft import get_peft_model_state_dict

    live = trained_parameters(model)
    saved = get_peft_model_state_dict(model, state_dict=live)
    by_identity = {id(param): name for name, param in saved.items()}
    return {by_identity[id(param)]: param for param in live.values() if id(param) in by_identity}


@torch.no_grad()
def gathered_adapter(model: torch.nn.Module, main: bool) -> dict[str, torch.Tensor] | None:
    """A PEFT model's trained parameters whole, by their live names (for ``PeftModel.save_pretrained(state_dict=)``),
    gathered from ZeRO-3 partitions or FSDP2 shards without the frozen base. Every process must call it; the main one
    gets CPU copies, the others None."""
    params = trained_parameters(model)
    state = {} if main else None
    with _gathered_zero3(list(params.values())):
        for name, param in params.items():
            whole = param.full_tensor() if hasattr(param, "full_tensor") else param  # FSDP2: a collective
            if main:
                state[name] = whole.detach().to("cpu", copy=True)
    return state


@torch.no_grad()
def load_distributed_adapter(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Copy a saved adapter (``adapter_model.safetensors``'s tensors, whole) into a PEFT model whose parameters are
    ZeRO-3 partitions or FSDP2 shards: only the adapter's parameters are gathered (ZeRO-3) or cut into this process's
    shard (FSDP2). Every process must call it with the same ``state``. Returns the names ``state`` lacks."""
    from torch.distributed.tensor import distribute_tensor

    params = saved_adapter_parameters(model)
    unexpected = sorted(set(state) - set(params))
    if unexpected:
        raise KeyError(f"adapter tensors not in the model: {unexpected[:5]}")
    with _gathered_zero3(list(params.values()), modify=True):
        for name, param in params.items():
            if name not in state:
                continue
            value = state[name].to(param.dtype)
            if hasattr(param, "full_tensor"):
                shard = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(shard.to_local())
            else:
                param.copy_(value)
    return sorted(set(params) - set(state))


@contextlib.contextmanager
def fsdp2_whole_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Every FSDP2 shard (``DTensor`` parameter) of ``model`` replaced by its whole tensor for the block, to read
    (restored after): code that reads the modules' weights, such as PEFT's ``get_delta_weight`` and ``state_dict``,
    sees plain whole tensors. One whole copy of the model per process while it lasts; every process must enter it."""
    swapped = []
    try:
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is not None and hasattr(param, "full_tensor"):
                    swapped.append((module, name, param))
                    module._parameters[name] = param.full_tensor()
        yield
    finally:
        for module, name, param in reversed(swapped):
            module._parameters[name] = param


def _gathered_zero3(params: list[torch.nn.Parameter], modify: bool = False):
    """DeepSpeed's ``GatheredParameters`` for the ZeRO-3 partitioned ones of ``params`` (with ``modify``, the main
    process's writes are partitioned to every process at the end); else nothing."""
    partitioned = [p for p in params if hasattr(p, "ds_id")]
    if not partitioned:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=0 if modify else None)
