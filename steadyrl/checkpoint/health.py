"""A checkpoint holds finite numbers only: what a save refuses to write, and what a resume passes over.

A save checks, in memory and before writing, every process's own weights (ZeRO-3 partitions, FSDP2 shards), optimizer
state and the state the loop carries (an algorithm's coefficients), and marks the checkpoint as checked
(``CHECKED_KEY`` in steadyrl_state.json). A checkpoint without the mark (an earlier steadyrl's, or a Trainer's) is
read back and checked when a resume considers it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ..ops.finite import nonfinite_numbers, nonfinite_tensors, refuse_found, refuse_nonfinite

CHECKED_KEY = "finite_checked"  # steadyrl_state.json: its numbers were checked finite as it was saved
STATE_NAME = "steadyrl_state.json"
NOT_PARTS = ("format", "fingerprint", CHECKED_KEY)


def local_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """This process's share of ``model``'s parameters and buffers: a ZeRO-3 parameter's partition, an FSDP2 shard,
    else the tensor itself."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if hasattr(tensor, "ds_tensor"):
            yield name, tensor.ds_tensor
        elif hasattr(tensor, "to_local"):
            yield name, tensor.to_local()
        else:
            yield name, tensor


def refuse_nonfinite_weights(model: torch.nn.Module, whose: str) -> None:
    refuse_nonfinite(local_weights(model), f"Refused to save the {whose}'s weights")


def refuse_nonfinite_state(state: dict, what: str) -> None:
    """``NonFiniteError`` if the nested ``state`` (an optimizer's, the loop's parts) holds a non-finite number."""
    refuse_found(nonfinite_numbers(state), f"Refused to save {what}")


def nonfinite_in_checkpoint(directory: Path) -> list[str]:
    """Where a written checkpoint holds a non-finite number (``file:tensor``): its weights (safetensors), its optimizer,
    scheduler and scaler files, and the loop state the processes share; empty if none, or if the checkpoint was
    checked as it was saved. Each tensor is read from disk one at a time."""
    state_file = directory / STATE_NAME
    shared = json.loads(state_file.read_text()) if state_file.is_file() else {}
    if shared.get(CHECKED_KEY):
        return []
    parts = {key: value for key, value in shared.items() if key not in NOT_PARTS}
    found = [f"{STATE_NAME}:{name}" for name in nonfinite_numbers(parts)]
    for path in sorted(directory.rglob("*.safetensors")):
        if path.parent == directory and "_" in path.stem and path.stem.rsplit("_", 1)[1].isdigit():
            continue  # a process's loop state (a rollout's scores hold NaN where a reward function did not apply)
        with safe_open(str(path), "pt") as weights:
            found += [f"{path.relative_to(directory)}:{name}" for name in weights.keys() if _bad(weights, name)]
    for path in sorted(directory.rglob("*.pt")):
        state = torch.load(path, weights_only=True, mmap=True)
        found += [f"{path.relative_to(directory)}:{name}" for name in nonfinite_numbers(state)]
    return found


def _bad(weights, name: str) -> bool:
    return bool(nonfinite_tensors([(name, weights.get_tensor(name))]))
