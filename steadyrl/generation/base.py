"""The generation interface of the shared loop: prompt token ids in, completion token ids out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class SamplingSettings:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    batch_size: int = 8  # sequences per generation call (micro_rollout_batch_size)


class GenerationBackend(ABC):
    """Generates one completion per prompt row; rows that share a prompt are sampled independently."""

    def __init__(self, tokenizer, settings: SamplingSettings) -> None:
        self.tokenizer = tokenizer
        self.settings = settings

    def sync_weights(self, model: torch.nn.Module) -> None:  # noqa: B027 - optional hook, no-op by default
        """Make the engine generate with ``model``'s current weights (no-op when it uses the model directly)."""

    @abstractmethod
    def generate(self, model: torch.nn.Module, prompt_ids: list[list[int]]) -> list[list[int]]:
        """Completion token ids for each prompt, ending with EOS if one was produced, without padding."""


def trim_completion(ids: list[int], eos_token_id: int | None, pad_token_id: int | None) -> list[int]:
    """Cut a generated row after its first EOS and drop padding."""
    if eos_token_id is not None and eos_token_id in ids:
        return ids[: ids.index(eos_token_id) + 1]
    return [t for t in ids if t != pad_token_id]
