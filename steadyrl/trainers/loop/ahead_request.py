"""What a rollout requested ahead of training (``max_staleness``) holds, and the pure functions around it: the
request (``Ahead``), a process's share of a whole rollout, and the copies a request keeps."""

from __future__ import annotations

import copy
import dataclasses
from concurrent.futures import Future

import torch

from ...data.images import prompt_images
from ...data.json_columns import from_state, to_state
from ...rollout import SampledRollout
from ...vision import ImageBatch


@dataclasses.dataclass
class Ahead:
    """One rollout requested ahead: its request (everything its completions and scores depend on), and once the
    worker has it, the rollout (``result``; the copy of the weights is then let go)."""

    prompts: list
    columns: dict[str, list]
    seeds: list[int]
    prompt_ids: list[list[int]]
    truncated: int
    version: int  # the global step of the weights it is sampled with
    state: dict  # the TrainerState fields its reward functions read (``trainer_state``), as at ``version``
    weights: dict[str, torch.Tensor] | None  # the actor's (merged) weights at ``version``
    result: SampledRollout | None = None
    future: Future | None = None  # None: not submitted yet (a request restored from a checkpoint)
    prompt_index: list[int] | None = None  # [N] each sample's prompt's row in the dataset (older checkpoints: None)
    images: ImageBatch | None = None  # [N] the prompts' image inputs (a vision-language model's)

    def request_state(self) -> dict:
        """The request as a checkpoint stores it: images as their pixels, image inputs as tensors (exactly)."""
        fields = ("seeds", "prompt_ids", "truncated", "version", "state", "prompt_index")
        request = {name: getattr(self, name) for name in fields}
        request.update(prompts=to_state(self.prompts), columns=to_state(self.columns))
        return {**request, "images": None if self.images is None else self.images.flat()}

    @classmethod
    def from_request(cls, request: dict, weights: dict[str, torch.Tensor]) -> Ahead:
        prompts, images = from_state(request["prompts"]), request.get("images")
        images = None if images is None else with_sources(ImageBatch.from_flat(images), prompts)
        fields = {**request, "prompts": prompts, "columns": from_state(request["columns"]), "images": images}
        return cls(**fields, weights=weights)


def with_sources(images: ImageBatch, prompts: list) -> ImageBatch:
    """``images`` read back from a checkpoint, with each sample's images (its prompt's) for the engine."""
    images.sources = [prompt_images(prompt) for prompt in prompts]
    return images


def share_of(rollout: SampledRollout, rank: int, processes: int) -> SampledRollout:
    """Process ``rank``'s share of a whole rollout (its samples in process order): as ``PromptDraw`` would have drawn
    it for that process."""
    if processes == 1:
        return rollout
    size = len(rollout.prompts) // processes
    rows = slice(rank * size, (rank + 1) * size)
    images = rollout.images
    if images is not None:
        images = ImageBatch.from_flat(images).select(rows).flat()
    return dataclasses.replace(
        rollout,
        prompts=rollout.prompts[rows],
        columns={name: values[rows] for name, values in rollout.columns.items()},
        prompt_ids=rollout.prompt_ids[rows],
        completion_ids=rollout.completion_ids[rows],
        logprobs=rollout.logprobs[rows],
        scores=None if rollout.scores is None else rollout.scores[rows],
        prompt_index=None if rollout.prompt_index is None else rollout.prompt_index[rows],
        images=images,
        env_mask=None if rollout.env_mask is None else rollout.env_mask[rows],
        completions=None if rollout.completions is None else rollout.completions[rows],
        versions=None if rollout.versions is None else rollout.versions[rows],
        stopped=None if rollout.stopped is None else rollout.stopped[rows],
        seeds=None if rollout.seeds is None else rollout.seeds[rows],
    )


def cpu_copy(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CPU copy of ``weights`` in which tensors that are one (tied embeddings) stay one: a tied 151,936-token head
    of a 0.5B model is 0.5 GB."""
    copies, copied = {}, {}
    for name, tensor in weights.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if key not in copied:
            copied[key] = tensor.detach().to("cpu", copy=True)
        copies[name] = copied[key]
    return copies


def state_fields(state) -> dict:
    """A TrainerState's fields but its log history (which a copy shares with the live state, as it is restored)."""
    return {f.name: copy.deepcopy(getattr(state, f.name)) for f in dataclasses.fields(state) if f.name != "log_history"}


def check_partial_rollouts(tokens: int, multi_turn: bool, images: bool) -> None:
    """What partial rollouts (``partial_rollout_tokens``) cannot continue yet, refused with the reason."""
    if tokens and multi_turn:
        raise ValueError(
            f"partial_rollout_tokens={tokens} with tools or environment_factory: a trajectory ahead is generated turn "
            "by turn with one weight version, and its turns are not cut into partial segments yet. Use "
            "partial_rollout_tokens=0 (max_staleness still generates the trajectories ahead)."
        )
    if tokens and images:
        raise ValueError(
            f"partial_rollout_tokens={tokens} with a vision-language model's images: a completion with images is not "
            "continued from its first segment yet (the server's image route takes the prompt's images, not a "
            "completion so far). Use partial_rollout_tokens=0."
        )
