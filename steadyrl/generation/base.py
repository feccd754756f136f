"""The generation interface of the shared loop: prompt token ids in, completion token ids out."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from ..vision import ImageBatch


@dataclass
class SamplingSettings:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    extra: dict = field(default_factory=dict)  # generation_kwargs: more GenerationConfig / SamplingParams arguments
    cache_implementation: str | None = None  # transformers' KV cache (HF generate only)
    regex: str | None = None  # vLLM's structured outputs: completions match it (vLLM only)

    @classmethod
    def from_config(cls, args) -> SamplingSettings:
        """The sampling settings of an ``OnPolicyConfig``."""
        return cls(
            max_new_tokens=args.max_completion_length,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            extra=dict(args.generation_kwargs or {}),
            cache_implementation=args.cache_implementation,
            regex=args.vllm_structured_outputs_regex,
        )


@dataclass(frozen=True)
class Capabilities:
    """What a generation backend can do, as the trainer and the config's checks ask it.

    Args:
        runs_training_model: samples with the trained model itself (gathered first under ZeRO-3 or FSDP2, called in
            chunks of ``micro_generation_batch_size`` rows); False: an engine with its own copy of the weights.
        returns_logprobs: reports each sampled token's log-prob (the check of the weight sync, and
            ``vllm_importance_sampling_correction``).
        weight_push: how the actor's weights reach the engine after an update: ``"full"`` (every weight, LoRA
            merged), ``"adapter"`` (a LoRA actor's adapter alone); empty for a backend that samples with the model.
        pushes_copies: ``push_copy`` generates from a copy of the weights taken earlier (``max_staleness``).
        takes_images: ``generate`` takes a vision-language model's image inputs (``images=``).
    """

    runs_training_model: bool = False
    returns_logprobs: bool = False
    weight_push: frozenset[str] = frozenset()
    pushes_copies: bool = False
    takes_images: bool = False


@dataclass
class Generation:
    completion_ids: list[list[int]]  # per prompt row, ending with EOS if one was produced, without padding
    logprobs: list[list[float]] | None = None  # the engine's log-prob of each of those tokens, if it reports them
    images: ImageBatch | None = None  # the prompt rows' image inputs (a vision-language model's), set by the source
    stopped: list[bool] | None = None  # per row: it ended by itself (EOS, a stop), not at a limit; None: not reported

    @classmethod
    def concatenate(cls, parts: list[Generation]) -> Generation:
        """The generations of consecutive chunks of prompt rows as one."""
        ids = [row for part in parts for row in part.completion_ids]
        reported = parts and all(part.logprobs is not None for part in parts)
        logprobs = [row for part in parts for row in part.logprobs] if reported else None
        images = [part.images for part in parts if part.images is not None]
        return cls(ids, logprobs, ImageBatch.concatenate(images) if images and len(images) == len(parts) else None)


class GenerationBackend(ABC):
    """Generates one completion per prompt row; rows that share a prompt are sampled independently.

    A backend is registered by name in ``steadyrl.generation.BACKENDS``; the config names it
    (``OnPolicyConfig.generation_backend``) and ``make_backend`` builds it with ``from_config``.
    """

    capabilities = Capabilities(runs_training_model=True)
    # a vision-language model's run sets both (trainers/loop/vision_checks.py): the image tokens never sampled, and
    # the processor, for an engine that processes the images itself (vLLM)
    suppressed: tuple[int, ...] = ()
    processor = None

    def __init__(self, tokenizer, settings: SamplingSettings) -> None:
        self.tokenizer = tokenizer
        self.settings = settings

    @classmethod
    def from_config(cls, args, tokenizer, model: torch.nn.Module, device: torch.device, logprob_temperature: float):
        """The backend for an ``OnPolicyConfig``, with every check that can fail before training; the default
        takes the sampling settings only. ``logprob_temperature``: the temperature of the trainer's log-probs."""
        return cls(tokenizer, SamplingSettings.from_config(args))

    @property
    def max_model_len(self) -> int | None:
        """The longest sequence (prompt and completion) the engine takes; None: the model's own limit."""
        return None

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:  # noqa: B027 - optional hook
        """Make the engine generate with ``model``'s weights as of ``version`` (the global step); a no-op for
        a backend that samples with the model itself."""

    @abstractmethod
    def generate(
        self, model: torch.nn.Module, prompt_ids: list[list[int]], seeds: list[int], images: ImageBatch | None = None
    ) -> Generation:
        """Sample one completion per prompt row; ``seeds`` holds one sampling seed per row for engines that
        take them (HF generate draws from the global torch RNG instead, which checkpoints restore)."""

    def push_copy(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Generate from now on with ``weights``, a copy of the actor's (merged) at ``version`` taken earlier, from
        another thread than the trainer's (``max_staleness``). Only where ``capabilities.pushes_copies``."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot generate from a copy of the weights taken earlier "
            "(capabilities.pushes_copies is False), which max_staleness > 0 needs: use use_vllm=True with "
            "vllm_mode='server', or max_staleness=0."
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources (a later ``sync_weights`` starts it again)."""

    def release(self) -> None:  # noqa: B027 - optional hook
        """Free what another run may use meanwhile (a vLLM server's claim) after a standalone ``evaluate()``,
        keeping what is costly to rebuild (a colocated engine); a later ``sync_weights`` takes it again."""


def trim_completion(ids: list[int], eos_token_id: int | None) -> list[int]:
    """Cut a generated row after its first EOS: what follows is batch padding. A row without EOS ran to the
    length limit and is kept whole, pad tokens it sampled included, so training sees exactly what was sampled."""
    if eos_token_id is not None and eos_token_id in ids:
        return ids[: ids.index(eos_token_id) + 1]
    return ids


def sampling_seed(seed: int, rollout: int, prompt: int, sample: int) -> int:
    """A 63-bit sampling seed for one completion, from the run seed, the rollout index, the prompt's index in the
    rollout (over all processes) and the sample index: stable across processes, restarts and engine instances."""
    digest = hashlib.blake2b(f"{seed}/{rollout}/{prompt}/{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)
