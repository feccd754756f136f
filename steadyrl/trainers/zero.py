"""DeepSpeed ZeRO stage 1/2 optimizer state, per process, as plain tensors (loaded with ``weights_only=True``).

Under ZeRO each process holds the AdamW moments and fp32 master weights of its own partition of the
parameters. DeepSpeed's ``state_dict`` pickles its own classes (loss scaler, enums, slice mappings); this
module saves only what resuming needs — the inner torch optimizer's state and the fp32 partitions — and
puts them back into the live optimizer of the same layout (same processes, same model, which the run's
fingerprint guarantees).
"""

from __future__ import annotations

import torch


def zero_optimizer(optimizer):
    """The DeepSpeed ZeRO (stage 1/2) optimizer inside accelerate's wrapper, or None."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if hasattr(inner, "single_partition_of_fp32_groups") else None


def zero_state(optimizer) -> dict:
    zero = zero_optimizer(optimizer)
    return {
        "base_optimizer": zero.optimizer.state_dict(),
        "fp32_partitions": [p.detach().clone() for p in zero.single_partition_of_fp32_groups],
    }


@torch.no_grad()
def load_zero_state(optimizer, state: dict) -> None:
    zero = zero_optimizer(optimizer)
    zero.optimizer.load_state_dict(state["base_optimizer"])
    for live, saved in zip(zero.single_partition_of_fp32_groups, state["fp32_partitions"], strict=True):
        live.copy_(saved)
