"""The stateful parts of a run besides its models and optimizers (prompt sampler, rollout buffer, rollouts generated
ahead, metrics not yet logged, the algorithm's state, RNG, ...): each registers with the checkpointer under its name
and provides ``state_dict`` / ``load_state_dict``, so adding state to the loop touches the file that creates it only.

A part is either the same on every process (stored in ``steadyrl_state.json`` under its name) or each process's own
(stored as ``<name>_<rank>.json``, its tensors, if any, in ``<name>_<rank>.safetensors``). States are JSON-able
dicts whose leaves may be tensors; nothing is pickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from .manifest import CheckpointError

RESERVED = ("format", "fingerprint", "finite_checked")  # keys of steadyrl_state.json that are not parts
TENSOR_REF = "__tensor__"


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Resharded(Protocol):
    """A per-process part a run may resume on another number of processes with: this process's state from the
    saved processes' (``states[r]``: saved process r's, read when asked for; as many as processes wrote it)."""

    def reshard(self, states: Sequence[dict], rank: int, processes: int) -> dict: ...


class SavedStates(Sequence):
    """Every saved process's state of one part, each read from its files when first asked for."""

    def __init__(self, read: Callable[[int], dict], count: int) -> None:
        self.read, self.count, self.cache = read, count, {}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, rank):
        if isinstance(rank, slice):
            return [self[r] for r in range(*rank.indices(self.count))]
        if rank not in self.cache:
            self.cache[rank] = self.read(rank)
        return self.cache[rank]


def saved_processes(directory: Path) -> int:
    """How many processes wrote the checkpoint ``directory``: each writes its own RNG state."""
    count = 0
    while (directory / f"rng_state_{count}.json").is_file():
        count += 1
    return count


@dataclass(frozen=True)
class Part:
    name: str
    state: Stateful
    per_process: bool  # each process's own, in its own files; else the same on every process
    restore_last: bool  # restored by ``restore_last`` (after the callbacks' on_train_begin), not with the rest
    optional: bool = False  # a shared part older checkpoints lack: kept as it is when a checkpoint holds none


class StateRegistry:
    """The parts a checkpoint holds, by name, in registration order (the order they are restored in)."""

    def __init__(self) -> None:
        self.parts: dict[str, Part] = {}

    def register(
        self, name: str, state: Stateful, *, per_process: bool = False, restore_last: bool = False, optional=False
    ) -> None:
        if name in self.parts or name in RESERVED:
            raise ValueError(f"a checkpoint part named {name!r} is already registered (or reserved): pick another name")
        if not name.replace("_", "").isalnum() or not name.islower():
            raise ValueError(f"checkpoint part name {name!r}: use lowercase letters, digits and underscores")
        if optional and per_process:
            raise ValueError(f"checkpoint part {name!r}: only a part the same on every process can be optional")
        self.parts[name] = Part(name, state, per_process, restore_last, optional)

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

    def load(self, directory: Path, shared: dict, rank: int, processes: int = 1, last: bool = False) -> None:
        """Restore the parts (``last``: only those restored last; else all others) from a checkpoint, written by
        ``processes`` processes or (per-process parts that can be resharded, ``Resharded``) another number."""
        saved = saved_processes(directory) or processes
        for part in self.parts.values():
            if part.restore_last != last:
                continue
            if part.per_process and hasattr(part.state, "reshard"):
                states = SavedStates(lambda r, name=part.name: self._process_state(directory, name, r), saved)
                state = part.state.reshard(states, rank, processes)
            elif part.per_process and saved != processes:
                raise CheckpointError(
                    f"{directory} was written by {saved} processes and this run has {processes}: its "
                    f"{part.name!r} state cannot be split over another number of processes. Resume on {saved}."
                )
            elif part.per_process:
                state = self._process_state(directory, part.name, rank)
            elif part.name in shared:
                state = shared[part.name]
            elif part.optional:
                continue
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
