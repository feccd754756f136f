"""Every process's share of a rollout, put together on every process.

Each process generates and scores its share of a rollout's prompts; the mini-batches are then drawn over the whole
rollout (``rollout.RolloutBuffer``), so that which samples form an optimizer step does not depend on the number of
processes, and a run resumed on another number trains the same steps. A share's per-token fields are as wide as its
own longest prompt and completion: they are padded to the widest share (prompts on the left, completions on the
right, with masked zeros) before they are gathered in process order.
"""

from __future__ import annotations

import dataclasses

import torch

from ..rollout import Rollout
from ..vision import ImageBatch

PROMPT_FIELDS = ("prompt_ids", "prompt_mask")  # left-padded: padding goes first


def gather_rollout(rollout: Rollout, accelerator) -> Rollout:
    """The whole rollout (process 0's samples first) on every process; ``rollout`` itself on one process."""
    if accelerator.num_processes == 1:
        return rollout
    whole = {}
    for name, value in rollout.fields_by_row().items():
        if value.dim() > 1:
            value = accelerator.pad_across_processes(value, dim=1, pad_index=0, pad_first=name in PROMPT_FIELDS)
        whole[name] = accelerator.gather(value.contiguous())
    images = None if rollout.images is None else gather_images(rollout.images, accelerator)
    return dataclasses.replace(rollout, **whole, images=images)


def gather_images(images: ImageBatch, accelerator) -> ImageBatch:
    """Every process's image inputs in process order: the image rows (as many as each process has) cut from their
    padding, the token-aligned tensors left-padded to the widest."""
    rows = {}
    for name, value in images.rows.items():
        sizes = accelerator.gather(torch.tensor([len(value)], device=value.device)).tolist()
        padded = accelerator.pad_across_processes(value.contiguous(), dim=0)
        gathered, per = accelerator.gather(padded.contiguous()), padded.shape[0]
        rows[name] = torch.cat([gathered[i * per : i * per + size] for i, size in enumerate(sizes)])
    counts = {name: accelerator.gather(value.contiguous()) for name, value in images.counts.items()}
    tokens = {
        name: accelerator.gather(accelerator.pad_across_processes(value, dim=1, pad_first=True).contiguous())
        for name, value in images.tokens.items()
    }
    return ImageBatch(rows, counts, tokens)


def stack_shares(shares: list[Rollout]) -> Rollout:
    """Rollouts of different widths -> one, in order, each per-token field padded to the widest as in
    ``gather_rollout``."""
    whole = {}
    for name, first in shares[0].fields_by_row().items():
        parts = [share.fields_by_row()[name] for share in shares]
        if first.dim() > 1:
            width = max(part.shape[1] for part in parts)
            pad = [[width - p.shape[1], 0] if name in PROMPT_FIELDS else [0, width - p.shape[1]] for p in parts]
            parts = [torch.nn.functional.pad(part, tuple(sides)) for part, sides in zip(parts, pad)]
        whole[name] = torch.cat(parts)
    images = None if shares[0].images is None else ImageBatch.concatenate([share.images for share in shares])
    return dataclasses.replace(shares[0], **whole, images=images)


def whole_buffer_state(states: list[dict]) -> dict:
    """The buffer states of steadyrl's format 4, each process's share of a rollout with its own mini-batch schedule,
    -> the state of the whole rollout (format 5) that trains the same mini-batches: global mini-batch i is every
    process's i-th, in process order, so its ``p``-th part on as many processes is process p's."""
    shares = [Rollout.from_tensors(state["rollout"]) for state in states]
    offsets = [0]
    for share in shares[:-1]:
        offsets.append(offsets[-1] + len(share))
    schedule = [
        [index + offset for state, offset in zip(states, offsets) for index in state["schedule"][i]]
        for i in range(len(states[0]["schedule"]))
    ]
    keys = sorted({key for state in states for key in state["metrics"]})
    metrics = {key: sum(state["metrics"].get(key, 0.0) for state in states) / len(states) for key in keys}
    state = {**states[0], "schedule": schedule, "metrics": metrics, "whole": True}
    return {**state, "rollout": stack_shares(shares).tensors()}
