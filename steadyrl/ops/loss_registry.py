"""The policy losses by name, ``POLICY_LOSSES``: each an objective (policy_loss.py, ppo_loss.py) and an
aggregation (aggregations.py), built once from a config into a ``MicroBatchLoss``.

    name      objective            aggregation                                                   from
    grpo      ClippedSurrogate     SequenceMean: mean over sequences of each one's token mean    Shao et al., 2024
    bnpo      ClippedSurrogate     TokenMean: token mean over the micro-batch
    dr_grpo   ClippedSurrogate     FixedLengthSum: token sum / (B x max_completion_length)       Liu et al., 2025
    dapo      ClippedSurrogate     StepTokenMean: token sum / the rollout's loss tokens per      Yu et al., 2025
                                   micro-batch, a token mean over the whole optimizer step
    rloo      SequenceRatio        BatchMean: mean of the [B, 1] sequence losses                 Ahmadian et al., 2024
    cispo     CISPO                StepTokenMean                                                 MiniMax, 2025
    sapo      SAPO                 SequenceMean                                                  arXiv 2511.20347
    luspo     ClippedSurrogate     SequenceSum: mean over sequences of each one's token sum      arXiv 2602.05261
    vespo     VESPO                StepTokenMean                                                 arXiv 2602.10693
    ppo       PPOClippedSurrogate  TokenMean                                     PPO's actor, Schulman et al., 2017
    ppo_value ClippedValue         TokenMean                                     PPO's critic

GRPOConfig, RLOOConfig and ReinforcePPConfig accept the ``shared`` names as ``loss_type`` (RLOO also its ``rloo``);
PPO builds ``ppo`` and ``ppo_value`` itself. Adding a loss is a ``PolicyLoss`` subclass that owns its
hyperparameters (its constructor's arguments, read by ``from_config``, checked by ``check``), one line here, and a
config field for each hyperparameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .aggregations import (
    Aggregation,
    BatchMean,
    FixedLengthSum,
    SequenceMean,
    SequenceSum,
    StepTokenMean,
    TokenMean,
)
from .policy_loss import CISPO, SAPO, VESPO, ClippedSurrogate, PolicyLoss, SequenceRatio
from .ppo_loss import ClippedValue, PPOClippedSurrogate


@dataclass(frozen=True)
class MicroBatchLoss:
    """A built loss: an objective and an aggregation, each holding its hyperparameters, and the coefficient of the KL
    term a caller passes (``kl=``: GRPO's, with its ``beta``) and whether the importance ratio weighs it
    (``use_bias_correction_kl``). Built once per trainer (``RegisteredLoss.from_config``).

    Example::

        loss = POLICY_LOSSES["dapo"].from_config(GRPOConfig(output_dir="out"))
        value, metrics = loss(logprobs, old_logprobs, advantages, mask, tokens_per_micro_batch=tokens)
    """

    objective: PolicyLoss
    aggregation: Aggregation
    kl_coef: float = 0.0
    kl_bias_correction: bool = False

    def __call__(
        self,
        logprobs: torch.Tensor,  # [B, C]
        old_logprobs: torch.Tensor,  # [B, C]
        advantages: torch.Tensor,  # [B], or [B, C] (objective.takes_token_advantages)
        mask: torch.Tensor,  # [B, C]
        engine_weights: torch.Tensor | None = None,  # [B, C] or [B, 1]: pi_trainer / pi_vLLM, truncated
        kl: torch.Tensor | None = None,  # [B, C]: GRPO's KL term, added with coefficient kl_coef
        tokens_per_micro_batch: float | torch.Tensor | None = None,
        keep: torch.Tensor | None = None,  # [B, C] or [B, 1]: 0 where a token selection drops the policy term
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's loss and metrics: the objective's per-token loss, times ``keep`` (entropy and
        off-policy masking) and the engine weights, plus kl_coef x KL (times w with ``kl_bias_correction``),
        aggregated over ``mask`` (TRL's order: a dropped token still counts where the aggregation counts tokens)."""
        if self.objective.folds_engine_weights:
            out = self.objective(logprobs, old_logprobs, advantages, mask, engine_weights=engine_weights)
            per_token = out.loss
        else:
            out = self.objective(logprobs, old_logprobs, advantages, mask)
            per_token = out.loss if engine_weights is None else out.loss * engine_weights
        if keep is not None:
            per_token = per_token * keep
        if kl is not None:
            if self.kl_bias_correction:
                kl = kl * torch.exp(out.log_weights)
            per_token = per_token + self.kl_coef * kl
        loss = self.aggregation(per_token, mask, tokens_per_micro_batch)
        return loss, self.objective.metrics(out.flags, mask)


class RegisteredLoss(NamedTuple):
    """A ``loss_type``: its objective's and aggregation's classes. ``shared``: accepted by GRPOConfig and RLOOConfig
    alike; else only by a config that names it in ``extra_loss_types`` (RLOO's own ``rloo``), or built by an
    algorithm itself (PPO's ``ppo`` and ``ppo_value``).

    Example::

        POLICY_LOSSES["my_loss"] = RegisteredLoss(MyObjective, TokenMean)
        loss = POLICY_LOSSES["my_loss"].from_config(config)  # once; then per micro-batch:
        value, metrics = loss(logprobs, old_logprobs, advantages, mask)
    """

    objective: type[PolicyLoss]
    aggregation: type[Aggregation]
    shared: bool = True

    @property
    def description(self) -> str:
        return f"{self.objective.description}, {self.aggregation.description}"

    def check(self, config) -> None:
        """Refuse the config's values this loss's objective cannot use (its ``check``)."""
        self.objective.check(config)

    def from_config(self, config, kl_coef: float = 0.0, kl_bias_correction: bool = False) -> MicroBatchLoss:
        """The loss with the config's hyperparameters (and a KL term's coefficient where the caller adds one)."""
        return MicroBatchLoss(
            self.objective.from_config(config), self.aggregation.from_config(config), kl_coef, kl_bias_correction
        )


POLICY_LOSSES: dict[str, RegisteredLoss] = {
    "grpo": RegisteredLoss(ClippedSurrogate, SequenceMean),
    "bnpo": RegisteredLoss(ClippedSurrogate, TokenMean),
    "dr_grpo": RegisteredLoss(ClippedSurrogate, FixedLengthSum),
    "dapo": RegisteredLoss(ClippedSurrogate, StepTokenMean),
    "rloo": RegisteredLoss(SequenceRatio, BatchMean, shared=False),
    "cispo": RegisteredLoss(CISPO, StepTokenMean),
    "sapo": RegisteredLoss(SAPO, SequenceMean),
    "luspo": RegisteredLoss(ClippedSurrogate, SequenceSum),  # LUSPO: GSPO's weights, each sequence x its length
    "vespo": RegisteredLoss(VESPO, StepTokenMean),
    "ppo": RegisteredLoss(PPOClippedSurrogate, TokenMean, shared=False),  # PPO's actor
    "ppo_value": RegisteredLoss(ClippedValue, TokenMean, shared=False),  # PPO's critic
}
