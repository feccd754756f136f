"""FSDP2 (torch's ``fully_shard``, through accelerate's FSDP plugin with ``fsdp_version: 2``): what the on-policy loop
needs beyond accelerate's ``prepare``.

Under FSDP2 each trained model's parameters are ``DTensor`` shards, one unit per decoder layer. This module gathers
them whole where something outside training reads them (checkpoints, ``save_model``, vLLM's weight sync, HF
generation), puts whole weights back into shards on resume, and turns each process's optimizer state into plain
tensors and back: ``optimizer.state_dict()`` holds ``DTensor`` moments, which ``torch.load(weights_only=True)`` does
not load. Only public torch APIs are used (``DTensor``, ``FSDPModule``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .. import compat
from .sharded_loading import on_main_only


def _dtensor_type():
    from torch.distributed.tensor import DTensor

    return DTensor


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (``DTensor``)."""
    dtensor = _dtensor_type()
    return any(isinstance(p, dtensor) for p in model.parameters())


def enable(accelerator, model: torch.nn.Module, plugin_args: dict | None = None) -> int | None:
    """The FSDP version the run asked for (``accelerate launch`` with ``distributed_type: FSDP``, or
    ``TrainingArguments.fsdp``, whose ``fsdp_plugin_args`` are ``plugin_args``), else None, after refusing what
    ``check_fsdp_support`` refuses; on a machine without a GPU, where accelerate falls back to DDP without a word,
    FSDP is switched on again."""
    version = compat.enable_accelerate_fsdp(accelerator, plugin_args)
    if version is not None:
        check_fsdp_support(accelerator.state.fsdp_plugin, model)
        broadcast_at_prepare(accelerator, model)
    return version


def broadcast_at_prepare(accelerator, model: torch.nn.Module) -> None:
    """If only the main process holds ``model``'s weights (``sharded_loading.load_trained_on_main``), have
    accelerate's ``prepare`` broadcast them into every process's shards (its ``cpu_ram_efficient_loading``; for a
    model every process holds whole, that copies the same numbers)."""
    if on_main_only(model) and getattr(accelerator.state, "fsdp_plugin", None) is not None:
        accelerator.state.fsdp_plugin.cpu_ram_efficient_loading = True


def check_fsdp_support(plugin, model: torch.nn.Module) -> None:
    """Refuse the FSDP settings (accelerate's ``FullyShardedDataParallelPlugin``) the loop does not support, before
    any work."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    if plugin.fsdp_version != 2:
        raise ValueError(
            f"fsdp_version={plugin.fsdp_version} is not supported: steadyrl runs FSDP2 (torch's fully_shard) only. "
            "Set fsdp_version: 2 in the accelerate config (examples/accelerate_configs/fsdp2.yaml) or version 2 in "
            "fsdp_config, or use DeepSpeed ZeRO (zero2.yaml, zero3.yaml)."
        )
    if isinstance(plugin.cpu_offload, CPUOffloadPolicy):
        raise ValueError(
            "fsdp_offload_params=true is not supported under FSDP2: steadyrl's checkpoints and generation are not "
            "tested with parameters offloaded to CPU memory. Set fsdp_offload_params: false, or use DeepSpeed ZeRO-3 "
            "with offload (examples/accelerate_configs/zero3_offload.yaml)."
        )


@torch.no_grad()
def full_state_dict(model: torch.nn.Module, everywhere: bool) -> dict[str, torch.Tensor] | None:
    """``model``'s state dict with every shard gathered whole, one tensor at a time (every process must call it):
    on every process with ``everywhere``, else on the main process only (CPU copies) and None on the others."""
    import torch.distributed as dist

    dtensor = _dtensor_type()
    main = not dist.is_initialized() or dist.get_rank() == 0
    state = {} if everywhere or main else None
    # tied weights (one parameter under two names) stay one tensor, which save_pretrained then writes once
    first_name: dict[int, str] = {}
    source = {name: first_name.setdefault(id(p), name) for name, p in model.named_parameters(remove_duplicate=False)}
    gathered: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = source.get(name, name)
        if key not in gathered:
            whole = tensor.full_tensor() if isinstance(tensor, dtensor) else tensor
            gathered[key] = whole if everywhere else whole.detach().to("cpu", copy=True)
        if state is not None:
            state[name] = gathered[key]
    return state


def sharded_like(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (whole tensors, the same on every process) with each tensor that ``model`` holds as a shard cut
    into this process's shard, without communication; for ``model.load_state_dict``."""
    from torch.distributed.tensor import distribute_tensor

    dtensor = _dtensor_type()
    live = model.state_dict()
    out = {}
    for name, value in state.items():
        target = live.get(name)
        if isinstance(target, dtensor):
            value = distribute_tensor(value.to(target.dtype), target.device_mesh, target.placements, src_data_rank=None)
        out[name] = value
    return out


def is_sharded_optimizer(optimizer) -> bool:
    """Whether ``optimizer`` steps FSDP2 shards: each process then holds the optimizer state of its own shards."""
    dtensor = _dtensor_type()
    return any(isinstance(p, dtensor) for group in optimizer.param_groups for p in group["params"])


def optimizer_shard_state(optimizer) -> dict:
    """This process's optimizer state as plain tensors: its ``state_dict`` with every ``DTensor`` replaced by its
    local shard."""
    dtensor = _dtensor_type()
    state = optimizer.state_dict()
    local = {
        key: {name: value.to_local().clone() if isinstance(value, dtensor) else value for name, value in entry.items()}
        for key, entry in state["state"].items()
    }
    return {"state": local, "param_groups": state["param_groups"]}


def load_optimizer_shard_state(optimizer, saved: dict) -> None:
    """Put ``optimizer_shard_state``'s tensors back into the live optimizer of the same layout (same processes, same
    model, which the run's fingerprint guarantees): each local shard becomes a ``DTensor`` of its parameter's mesh
    and placements again."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for key, entry in saved["state"].items():
        param = params[int(key)]
        restored = {}
        for name, value in entry.items():
            if isinstance(param, DTensor) and torch.is_tensor(value) and value.shape == param.to_local().shape:
                value = DTensor.from_local(
                    value.to(param.device),
                    param.device_mesh,
                    param.placements,
                    run_check=False,
                    shape=param.shape,
                    stride=param.stride(),
                )
            restored[name] = value
        state[int(key)] = restored
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})


@contextlib.contextmanager
def unsharded(model: torch.nn.Module, reshard_after_forward: bool = True) -> Iterator[None]:
    """Every FSDP2 unit of ``model`` whole for the block (one collective all-gather each, every process together)
    and left whole after each forward pass, so that ``generate`` runs as many forward passes on each process as its
    own completions need without waiting on the others. Costs one whole copy of the model per process while it
    lasts. Without FSDP2 units, nothing.

    Afterwards the units are resharded and reshard after forward as accelerate set them up: the root and the unit of
    the output embedding (with the final norm, and the input embedding when tied) keep their weights whole until
    the backward pass; every other unit follows the plugin's ``reshard_after_forward``."""
    from torch.distributed.fsdp import FSDPModule

    units = [module for module in model.modules() if isinstance(module, FSDPModule)]
    if not units:
        yield
        return
    if isinstance(model, FSDPModule):
        compat.fsdp2_root_initialised(model)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kept_whole = {id(model), id(output)}
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        # the kept units last: modules sharded as one group (the tail) share the setting
        for unit in sorted(units, key=lambda unit: id(unit) in kept_whole):
            unit.set_reshard_after_forward(reshard_after_forward and id(unit) not in kept_whole, recurse=False)
        for unit in units:
            unit.reshard()
