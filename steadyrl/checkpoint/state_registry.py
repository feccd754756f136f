"""The stateful parts of a run besides its models and optimizers (prompt sampler, rollout buffer, rollouts generated
ahead, metrics not yet logged, the algorithm's state, RNG, ...): each registers with the checkpointer under its name
and provides ``state_dict`` / ``load_state_dict``, so adding state to the loop touches the file that creates it only.

A part is either the same on every process (stored in ``steadyrl_state.json`` under its name) or each process's own
(stored as ``<name>_<rank>.json``, its tensors, if any, in ``<name>_<rank>.safetensors``). States are JSON-able
dicts whose leaves may be tensors; nothing is pickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from .manifest import CheckpointError

RESERVED = ("format", "fingerprint")  # keys of steadyrl_state.json that are not parts
TENSOR_REF = "__tensor__"


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class Part:
    name: str
    state: Stateful
    per_process: bool  # each process's own, in its own files; else the same on every process
    restore_last: bool  # restored by ``restore_last`` (after the callbacks' on_train_begin), not with the rest


class StateRegistry:
    """The parts a checkpoint holds, by name, in registration order (the order they are restored in)."""

    def __init__(self) -> None:
        self.parts: dict[str, Part] = {}

    def register(self, name: str, state: Stateful, *, per_process: bool = False, restore_last: bool = False) -> None:
        if name in self.parts or name in RESERVED:
            raise ValueError(f"a checkpoint part named {name!r} is already registered (or reserved): pick another name")
        if not name.replace("_", "").isalnum() or not name.islower():
            raise ValueError(f"checkpoint part name {name!r}: use lowercase letters, digits and underscores")
        self.parts[name] = Part(name, state, per_process, restore_last)

    def shared_states(self) -> dict[str, Any]:
        return {part.name: part.state.state_dict() for part in self.parts.values() if not part.per_process}

    def write_process_states(self, directory: Path, rank: int) -> None:
        """Write every per-process part of this process: ``<name>_<rank>.json`` (+ ``.safetensors`` for tensors)."""
        for part in self.parts.values():
            if part.per_process:
                tensors: dict[str, torch.Tensor] = {}
                state = _pull_tensors(part.state.state_dict(), "", tensors)
                (directory / f"{part.name}_{rank}.json").write_text(json.dumps(state))
                if tensors:
                    save_file(tensors, directory / f"{part.name}_{rank}.safetensors")

    def load(self, directory: Path, shared: dict, rank: int, last: bool = False) -> None:
        """Restore the parts (``last``: only those restored last; else all others) from a checkpoint."""
        for part in self.parts.values():
            if part.restore_last != last:
                continue
            if part.per_process:
                state = self._process_state(directory, part.name, rank)
            elif part.name in shared:
                state = shared[part.name]
            else:
                raise CheckpointError(f"{directory} holds no state for {part.name!r}, which this run keeps")
            part.state.load_state_dict(state)

    @staticmethod
    def _process_state(directory: Path, name: str, rank: int) -> dict:
        path = directory / f"{name}_{rank}.json"
        if not path.is_file():
            raise CheckpointError(f"{directory} has no {name!r} state for process {rank} ({path.name}).")
        state = json.loads(path.read_text())
        tensor_file = directory / f"{name}_{rank}.safetensors"
        tensors = load_file(tensor_file) if tensor_file.is_file() else {}
        return _push_tensors(state, tensors)


def _pull_tensors(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` with each tensor replaced by a reference to its entry in ``tensors`` (keyed by its dotted path:
    ``rollout.completion_ids``)."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.contiguous()
        return {TENSOR_REF: path}
    if isinstance(value, dict):
        return {key: _pull_tensors(item, f"{path}.{key}" if path else str(key), tensors) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_pull_tensors(item, f"{path}.{i}" if path else str(i), tensors) for i, item in enumerate(value)]
    return value


def _push_tensors(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {TENSOR_REF}:
            return tensors[value[TENSOR_REF]]
        return {key: _push_tensors(item, tensors) for key, item in value.items()}
    if isinstance(value, list):
        return [_push_tensors(item, tensors) for item in value]
    return value
