"""An optimizer's state as a checkpoint holds it, whichever way it is spread over processes: under DeepSpeed ZeRO
and FSDP2 each process saves and loads its own part, otherwise one whole state_dict serves every process."""

from __future__ import annotations

import torch

from .fsdp import is_sharded_optimizer, load_optimizer_shard_state, optimizer_shard_state
from .zero import load_zero_state, zero_optimizer, zero_state


def is_partitioned(optimizer: torch.optim.Optimizer) -> bool:
    """Whether each process holds its own part of ``optimizer``'s state (ZeRO partition, FSDP2 shards)."""
    return zero_optimizer(optimizer) is not None or is_sharded_optimizer(optimizer)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """This process's part of the state (the whole state_dict when not partitioned), as plain tensors and numbers."""
    if zero_optimizer(optimizer) is not None:
        return zero_state(optimizer)
    if is_sharded_optimizer(optimizer):
        return optimizer_shard_state(optimizer)
    return optimizer.state_dict()


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Put ``optimizer_state``'s result back into the live optimizer of the same layout."""
    if zero_optimizer(optimizer) is not None:
        load_zero_state(optimizer, state)
    elif is_sharded_optimizer(optimizer):
        load_optimizer_shard_state(optimizer, state)
    else:
        optimizer.load_state_dict(state)
