"""A resumable prompt sampler and the rollout buffer: the two pieces of loop state that a checkpoint carries."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file, save_file


def buffer_files(rank: int) -> tuple[str, str]:
    """Tensor and metadata file names of process ``rank``'s share of the rollout buffer."""
    return f"rollout_buffer_{rank}.safetensors", f"rollout_buffer_{rank}.json"


class PromptSampler:
    """Walks an endless sequence of seeded per-epoch permutations of ``num_prompts`` indices.

    Its whole state is the number of prompts consumed, so resuming is exact.
    """

    def __init__(self, num_prompts: int, seed: int) -> None:
        self.num_prompts = num_prompts
        self.seed = seed
        self.consumed = 0
        self._epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.num_prompts, generator=generator).tolist()
        return self._perm

    def next(self, count: int) -> list[int]:
        indices = []
        for k in range(self.consumed, self.consumed + count):
            indices.append(self._permutation(k // self.num_prompts)[k % self.num_prompts])
        self.consumed += count
        return indices

    @property
    def epoch(self) -> float:
        return self.consumed / self.num_prompts

    def state_dict(self) -> dict:
        return {"consumed": self.consumed, "num_prompts": self.num_prompts, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["num_prompts"] != self.num_prompts:
            raise ValueError(
                f"the checkpoint's prompt sampler covered {state['num_prompts']} prompts, "
                f"but train_dataset has {self.num_prompts}."
            )
        self.consumed, self.seed = state["consumed"], state["seed"]


@dataclass
class RolloutBuffer:
    """One rollout's experience (tensors with a leading sample dimension N) and its mini-batch schedule.

    ``schedule`` lists the sample indices of every mini-batch of every PPO epoch, fixed when the
    rollout is made; ``cursor`` is the next one to train on.
    """

    experience: dict[str, torch.Tensor]
    schedule: list[list[int]]
    metrics: dict[str, float] = field(default_factory=dict)
    cursor: int = 0

    @property
    def exhausted(self) -> bool:
        return self.cursor >= len(self.schedule)

    def next_minibatch(self) -> dict[str, torch.Tensor]:
        index = torch.tensor(self.schedule[self.cursor])
        self.cursor += 1
        return {key: value[index] for key, value in self.experience.items()}

    def save(self, directory: str | os.PathLike, rank: int) -> None:
        tensors, meta = buffer_files(rank)
        save_file({k: v.contiguous() for k, v in self.experience.items()}, os.path.join(directory, tensors))
        with open(os.path.join(directory, meta), "w") as f:
            json.dump({"schedule": self.schedule, "cursor": self.cursor, "metrics": self.metrics}, f)

    @classmethod
    def load(cls, directory: str | os.PathLike, rank: int) -> RolloutBuffer:
        tensors, meta = buffer_files(rank)
        with open(os.path.join(directory, meta)) as f:
            meta = json.load(f)
        experience = load_file(os.path.join(directory, tensors))
        return cls(experience=experience, schedule=meta["schedule"], metrics=meta["metrics"], cursor=meta["cursor"])


def minibatch_schedule(num_samples: int, minibatch_size: int, num_epochs: int, group_size: int = 1) -> list[list[int]]:
    """Shuffled mini-batches for each epoch (drawn from torch's global RNG, which checkpoints restore).

    Groups of ``group_size`` consecutive samples are shuffled as units and stay together, in order.
    """
    schedule = []
    for _ in range(num_epochs):
        groups = torch.randperm(num_samples // group_size).tolist()
        perm = [g * group_size + j for g in groups for j in range(group_size)]
        schedule += [perm[i : i + minibatch_size] for i in range(0, num_samples, minibatch_size)]
    return schedule
