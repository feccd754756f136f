"""Optimizer state written by N processes, put into the live layout of M: a resume on another number of processes.

A checkpoint keeps each process's optimizer state as it holds it (``optimizer_state.py``): the same number resumes
byte for byte from its own file. On another number, every process reads the parts of all N files it needs
(memory-mapped: only those pages are read) and builds its own part of the live layout from them:

- **DeepSpeed ZeRO-1/2**: each param group is one flat buffer (the parameters in order, each padded to 16 bytes, the
  whole padded to a multiple of the process count) cut into N equal partitions. Positions in the buffer do not
  depend on N, so this process's partition ``[r * S_M, (r + 1) * S_M)`` is read across the saved partitions.
- **DeepSpeed ZeRO-3**: each parameter is cut into N equal partitions of ``ceil(numel / N)`` elements (the last
  padded), and a process's flat sub-groups hold its partition of each parameter in order. Each parameter's saved
  partitions are found in the N streams and this process's partition of it is read across them.
- **FSDP2** (and one process without it): each parameter's state is sharded along dim 0 as ``torch.chunk`` cuts it;
  the saved shards are put together whole and cut again with the live parameter's own placements
  (``distribute_tensor``, no communication).

Padding positions hold zeros. Numbers that every process holds alike (Adam's ``step``, hyperparameters, the loss
scaler) come from process 0's file."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .. import compat
from .zero import zero_optimizer


class ReshardError(ValueError):
    """Saved optimizer state that cannot be put into the live optimizer's layout."""


def resharded_state(optimizer: torch.optim.Optimizer, saved: Sequence[dict], rank: int) -> dict:
    """This process's optimizer state, in ``optimizer_state``'s form for the live layout of ``optimizer``, built from
    the states ``saved`` by every process of a run with another number of processes (one whole state without
    ZeRO or FSDP2)."""
    zero = zero_optimizer(optimizer)
    zero_saved = all("fp32_partitions" in state for state in saved)
    if (zero is not None) != zero_saved:
        raise ReshardError(
            f"the checkpoint's optimizer state was written {'under' if zero_saved else 'without'} DeepSpeed ZeRO and "
            f"this run {'runs' if zero is not None else 'does not run'} under it: resume under the engine that "
            "wrote it (the same accelerate config, any number of processes)."
        )
    if zero is not None:
        return _zero_state(zero, saved, rank)
    return _sharded_state(optimizer, saved)


def own(entry: dict) -> dict:
    """``entry`` with tensors of its own: optimizers step scalars such as Adam's ``step`` in place, so no two
    entries may share one, nor may one be a view of a saved (memory-mapped) file."""
    return {key: value.clone() if torch.is_tensor(value) else value for key, value in entry.items()}


# ---- DeepSpeed ZeRO ---------------------------------------------------------------------------------------------


def read_span(chunks: Sequence[torch.Tensor], start: int, length: int) -> torch.Tensor:
    """Elements ``[start, start + length)`` of the concatenation of the equal-size 1-D ``chunks``, zeros past its
    end, without putting the chunks together."""
    out = torch.zeros(length, dtype=chunks[0].dtype)
    size = chunks[0].numel()
    position, end = start, start + length
    while position < end and size and position // size < len(chunks):
        index, offset = divmod(position, size)
        count = min(size - offset, end - position)
        out[position - start : position - start + count] = chunks[index][offset : offset + count]
        position += count
    return out


def _zero_state(zero, saved: Sequence[dict], rank: int) -> dict:
    """The same ZeRO stage wrote ``saved`` (the run's fingerprint holds it)."""
    if getattr(zero, "round_robin_gradients", False):
        raise ReshardError(
            "DeepSpeed's round_robin_gradients orders each partition's parameters by the number of processes, so its "
            "optimizer state cannot move to another number: resume on the number that wrote the checkpoint, or "
            "train without round_robin_gradients."
        )
    check_per_element(saved)
    live = compat.fp32_partitions(zero)
    spans = _stage3_spans(zero, saved, rank) if compat.is_stage3(zero) else _stage12_spans(live, saved, rank)

    def reshard(unit_tensors: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
        """The live units' tensors, from each saved process's units of the same quantity (fp32 weights, a moment)."""
        return [torch.cat([read(unit_tensors) for read in unit]) if unit else torch.zeros(0) for unit in spans]

    fp32 = [t.to(p.dtype) for t, p in zip(reshard([state["fp32_partitions"] for state in saved]), live, strict=True)]
    base = [state["base_optimizer"] for state in saved]
    first = base[0]["state"].get(0, {})
    moments = [key for key, value in first.items() if torch.is_tensor(value) and value.dim() > 0]
    per_unit = {key: reshard([[s["state"][u][key] for u in sorted(s["state"])] for s in base]) for key in moments}
    scalars = {key: value for key, value in first.items() if key not in moments}
    state = {u: {**own(scalars), **{key: per_unit[key][u] for key in moments}} for u in range(len(live)) if first}
    groups = compat.inner_optimizer_state(zero)["param_groups"]
    groups = [{**old, "params": new["params"]} for old, new in zip(base[0]["param_groups"], groups, strict=True)]
    return {
        "base_optimizer": {"state": state, "param_groups": groups},
        "fp32_partitions": fp32,
        "loss_scaler": saved[0].get("loss_scaler", {}),
    }


def check_per_element(saved: Sequence[dict]) -> None:
    """Every saved optimizer-state tensor that is not a number must hold one value per element of its unit's fp32
    partition (Adam's moments), the only state that can be cut along the partitions: a per-block or shared tensor
    (8-bit Adam's ``absmax1``, ``qmap1``) would be cut into wrong shapes without a word."""
    for process, state in enumerate(saved):
        partitions = state["fp32_partitions"]
        for unit, entry in state["base_optimizer"]["state"].items():
            size = partitions[unit].numel() if unit < len(partitions) else None
            for key, value in entry.items():
                if torch.is_tensor(value) and value.dim() > 0 and (value.dim() != 1 or value.numel() != size):
                    raise ReshardError(
                        f"the checkpoint's optimizer state {key!r} of process {process}'s fp32 partition {unit} has "
                        f"shape {list(value.shape)}, and the partition {size} elements: only state with one "
                        "value per parameter element (as Adam's exp_avg) can be cut for another number of processes, "
                        "not per-block or shared state (as 8-bit Adam's absmax1 or qmap1). Resume on the "
                        f"{len(saved)} process{'es' if len(saved) > 1 else ''} that wrote the checkpoint."
                    )


def _stage12_spans(live: Sequence[torch.Tensor], saved: Sequence[dict], rank: int) -> list[list]:
    """ZeRO-1/2: live group g is ``[rank * S_M, (rank + 1) * S_M)`` of the group's flat buffer."""
    if any(len(state["fp32_partitions"]) != len(live) for state in saved):
        raise ReshardError(
            f"the checkpoint's optimizer has {len(saved[0]['fp32_partitions'])} param groups and this run's "
            f"{len(live)}: the same model and optimizer settings are needed."
        )

    def span(group: int, size: int):
        return lambda tensors: read_span([t[group] for t in tensors], rank * size, size)

    return [[span(group, partition.numel())] for group, partition in enumerate(live)]


def _stage3_spans(zero, saved: Sequence[dict], rank: int) -> list[list]:
    """ZeRO-3: each live sub-group is this process's partition of each of its parameters, in order; a parameter's
    saved partitions lie at the same place in every saved process's sub-groups."""
    processes = len(saved)
    params = [param for group in zero.fp16_groups for param in group]
    saved_sizes = [math.ceil(param.ds_numel / processes) for param in params]
    units = [t.numel() for t in saved[0]["fp32_partitions"]]
    if sum(units) != sum(saved_sizes):
        raise ReshardError(
            f"the checkpoint's ZeRO-3 partitions hold {sum(units)} elements per process, and this model's parameters "
            f"cut into {processes} would hold {sum(saved_sizes)}: it was written for another model."
        )
    located, unit, offset = [], 0, 0  # (saved unit, offset in it) of each parameter's saved partition
    for size in saved_sizes:
        if offset == units[unit]:
            unit, offset = unit + 1, 0
        located.append((unit, offset))
        offset += size

    def span(index: int, param):
        unit, offset = located[index]
        size, live_size = saved_sizes[index], param.partition_numel()
        return lambda tensors: read_span(
            [t[unit][offset : offset + size] for t in tensors], rank * live_size, live_size
        )

    spans, index = [], 0
    for group in zero.fp16_groups:
        spans.append([span(index + i, param) for i, param in enumerate(group)])
        index += len(group)
    return spans


# ---- FSDP2 and whole states -----------------------------------------------------------------------------------


def _sharded_state(optimizer: torch.optim.Optimizer, saved: Sequence[dict]) -> dict:
    """Per parameter: each state tensor's saved shards put together along dim 0, then this process's shard of it as
    FSDP2 cuts the live parameter (the whole tensor without FSDP2)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for key, entry in saved[0]["state"].items():
        param = params[int(key)]
        restored = {}
        for name, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0:
                value = torch.cat([s["state"][key][name] for s in saved])
                if value.shape != param.shape:
                    raise ReshardError(
                        f"the checkpoint's optimizer state {name!r} of parameter {key} has shape "
                        f"{list(value.shape)} put together, and the parameter {list(param.shape)}: it was written "
                        "for another model."
                    )
                if isinstance(param, DTensor):
                    value = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
                    value = value.to_local()
            restored[name] = value
        state[key] = own(restored)
    return {"state": state, "param_groups": saved[0]["param_groups"]}
