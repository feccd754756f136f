"""The resumable prompt samplers: which prompts each rollout draws, in an order a checkpoint restores exactly."""

from __future__ import annotations

import torch

from .stream import StreamSampler, is_stream


class PromptSampler:
    """Walks an endless sequence of seeded per-epoch permutations of ``num_prompts`` indices (or, without
    ``shuffle``, the indices in order).

    Its whole state is the number of prompts consumed, so resuming is exact.
    """

    def __init__(self, num_prompts: int, seed: int, shuffle: bool = True) -> None:
        self.num_prompts = num_prompts
        self.seed = seed
        self.shuffle = shuffle  # False: the dataset's own order, every epoch
        self.consumed = 0
        self._epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                self._perm = torch.randperm(self.num_prompts, generator=generator).tolist()
            else:
                self._perm = list(range(self.num_prompts))
            self._epoch = epoch
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
        if "num_prompts" not in state:
            raise ValueError(
                "the checkpoint's prompt sampler read a streaming datasets.IterableDataset, but train_dataset is now "
                "a map-style datasets.Dataset: resume with the dataset the run started with."
            )
        if state["num_prompts"] != self.num_prompts:
            raise ValueError(
                f"the checkpoint's prompt sampler covered {state['num_prompts']} prompts, "
                f"but train_dataset has {self.num_prompts}."
            )
        self.consumed, self.seed = state["consumed"], state["seed"]


def make_sampler(
    dataset, seed: int, shuffle: bool, conversational: bool | None = None
) -> PromptSampler | StreamSampler:
    """A ``StreamSampler`` for a ``datasets.IterableDataset`` (read in its own order: ``shuffle`` does not apply),
    else a ``PromptSampler`` over the dataset's rows."""
    if is_stream(dataset):
        return StreamSampler(dataset, conversational)
    return PromptSampler(len(dataset), seed=seed, shuffle=shuffle)


def next_rows(
    sampler: PromptSampler | StreamSampler, dataset, count: int, part: slice
) -> tuple[dict[str, list], list[int]]:
    """Draw the next ``count`` prompts of the rollout (every process draws all of them, so that the position is the
    same everywhere) and return the rows of ``part`` of them as ``{column: values}``, with each one's index in the
    dataset (a stream's: its row in the epoch)."""
    if isinstance(sampler, StreamSampler):
        rows, places = sampler.next_indexed(count)
        rows, places = rows[part], places[part]
        return {column: [row[column] for row in rows] for column in (rows[0] if rows else {})}, places
    indices = sampler.next(count)[part]
    return dataset[indices], indices
