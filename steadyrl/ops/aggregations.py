"""How a policy loss's per-token terms [B, C] (or [B, 1], one per sequence) become a micro-batch's loss, over the
loss mask [B, C]: the aggregations ``ops.POLICY_LOSSES`` pairs with each objective (policy_loss.py). An aggregation
with a setting owns it (``FixedLengthSum``'s ``max_completion_length``), read once by ``from_config``."""

from __future__ import annotations

import abc
from typing import ClassVar

import torch


class Aggregation(abc.ABC):
    """How a per-token loss [B, C] or [B, 1] becomes the micro-batch's loss, over the loss mask [B, C].
    ``step_tokens``: it divides by ``tokens_per_micro_batch``, the rollout's loss tokens per micro-batch (over
    every process), which the trainer computes with the advantages.

    Example::

        TokenMean()(per_token_loss, mask)  # a scalar
        FixedLengthSum.from_config(GRPOConfig(output_dir="out", max_completion_length=256))
    """

    description: ClassVar[str] = ""
    step_tokens: ClassVar[bool] = False

    @classmethod
    def from_config(cls, config) -> Aggregation:
        """The aggregation with the config's values of its settings (it has none: ``cls()``)."""
        return cls()

    @abc.abstractmethod
    def __call__(
        self,
        per_token_loss: torch.Tensor,  # [B, C] or [B, 1]
        mask: torch.Tensor,  # [B, C]
        tokens_per_micro_batch: float | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The micro-batch's loss, a scalar."""


class SequenceMean(Aggregation):
    description = "mean over sequences of each sequence's token mean"

    def __call__(self, per_token_loss, mask, tokens_per_micro_batch=None):
        mask = mask.to(per_token_loss.dtype)
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


class TokenMean(Aggregation):
    description = "token mean over the micro-batch"

    def __call__(self, per_token_loss, mask, tokens_per_micro_batch=None):
        mask = mask.to(per_token_loss.dtype)
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


class FixedLengthSum(Aggregation):
    """Dr. GRPO's: the token sum over a fixed count, sequences x ``max_completion_length``."""

    description = "token sum / (sequences x max_completion_length)"

    def __init__(self, max_completion_length: int) -> None:
        self.max_completion_length = max_completion_length

    @classmethod
    def from_config(cls, config) -> FixedLengthSum:
        return cls(config.max_completion_length)

    def __call__(self, per_token_loss, mask, tokens_per_micro_batch=None):
        masked = per_token_loss * mask.to(per_token_loss.dtype)
        return masked.sum() / (masked.shape[0] * self.max_completion_length)


class StepTokenMean(Aggregation):
    description = "token mean over the whole optimizer step, across gradient accumulation and processes"
    step_tokens = True

    def __call__(self, per_token_loss, mask, tokens_per_micro_batch=None):
        masked = per_token_loss * mask.to(per_token_loss.dtype)
        return masked.sum() / torch.as_tensor(tokens_per_micro_batch).clamp(min=1.0)


class BatchMean(Aggregation):
    description = "mean over the sequences"

    def __call__(self, per_token_loss, mask, tokens_per_micro_batch=None):
        return per_token_loss.mean()  # [B, 1]: one term per sequence, whatever its tokens


class SequenceSum(Aggregation):
    description = "mean over sequences of each sequence's token sum (a sequence's weight grows with its length)"

    def __call__(self, per_token_loss, mask, tokens_per_micro_batch=None):
        return (per_token_loss * mask.to(per_token_loss.dtype)).sum(-1).mean()
