"""GRPO's and RLOO's policy losses (TRL's ``loss_type``): each a per-token objective plus an aggregation, by name.

Shapes: B sequences in a micro-batch, C completion tokens. An objective's loss is [B, C], or [B, 1] with one
importance weight per sequence; the aggregations multiply it by the [B, C] loss mask either way.

    w = pi / pi_old            per token ("token"), or exp(mean log-ratio of the sequence) ("sequence", GSPO)
    ClippedSurrogate  l = -min(w A, clip(w, 1 - eps, 1 + eps_high) A)   with ``delta``: w capped at delta first
    SequenceRatio     l = the same with w = exp(sum of the sequence's token log-ratios), one per sequence (TRL's RLOO)
    CISPO             l = -sg(min(w, eps_high)) A log pi                                 (MiniMax, 2025)
    SAPO              l = -sigmoid(tau (w - 1)) 4 / tau A, tau = tau_pos if A > 0 else tau_neg  (arXiv 2511.20347)

    SequenceMean      mean over sequences of each sequence's token mean                 grpo  (Shao et al., 2024)
    TokenMean         token mean over the micro-batch                                    bnpo
    FixedLengthSum    token sum / (B x max_completion_length)                            dr_grpo (Liu et al., 2025)
    StepTokenMean     token sum / mean loss tokens per micro-batch of the rollout: a     dapo, cispo (Yu et al., 2025)
                      token mean over the whole optimizer step, across accumulation and processes
    BatchMean         mean of the [B, 1] sequence losses                                 rloo  (Ahmadian et al., 2024)
    SequenceSum       mean over sequences of each sequence's token sum                   luspo (arXiv 2602.05261)

``POLICY_LOSSES`` pairs them under TRL's names; GRPOConfig and RLOOConfig accept its names. Adding a loss is a
``PolicyLoss`` subclass and one line there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar, NamedTuple

import torch

from .masked import masked_mean

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
ENGINE_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
TOKEN_OPTIONS = frozenset({"importance_sampling_level", "delta", "vllm_importance_sampling_correction"})


@dataclass(frozen=True)
class LossSettings:
    """The config values a policy loss reads (GRPOConfig's and RLOOConfig's names; ``of(config)`` takes them)."""

    cliprange: float = 0.2  # TRL: epsilon
    cliprange_high: float | None = None  # TRL: epsilon_high; None: cliprange
    delta: float | None = None
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    beta: float = 0.0  # the KL term's coefficient, where the trainer passes one
    use_bias_correction_kl: bool = False
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05

    @classmethod
    def of(cls, config) -> LossSettings:
        return cls(**{f.name: getattr(config, f.name, f.default) for f in fields(cls)})

    @property
    def high(self) -> float:
        return self.cliprange if self.cliprange_high is None else self.cliprange_high


class TokenLoss(NamedTuple):
    """An objective's result for one micro-batch."""

    loss: torch.Tensor  # [B, C], or [B, 1]: one term per sequence
    log_weights: torch.Tensor  # [B, C] or [B, 1]: log(pi / pi_old), by which GRPO's KL term is bias-corrected
    flags: dict[str, torch.Tensor]  # bool, [B, C]-broadcastable: where a clip binds; logged as shares of loss tokens


def importance_log_weights(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """log(pi / pi_old): [B, C] per token, or [B, 1] the mean over the sequence's tokens (GSPO's ``sequence``)."""
    log_ratio = logprobs - old_logprobs
    if level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def clipped_surrogate(
    log_weights: torch.Tensor,  # [B, C] or [B, 1]
    advantages: torch.Tensor,  # [B, 1] or [B, C]
    cliprange: float,
    cliprange_high: float | None = None,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate per token, -min(w A, clip(w, 1 - eps, 1 + eps_high) A), w = exp(log_weights); with
    ``delta`` the unclipped w is capped at ``delta`` too. Returns the loss and [B, C]-broadcastable bool masks of
    where the clip binds: ``low`` (w < 1 - eps, A < 0), ``high`` (w > 1 + eps_high, A > 0)."""
    high = cliprange if cliprange_high is None else cliprange_high
    weights = torch.exp(log_weights)
    clipped = weights.clamp(1 - cliprange, 1 + high)
    capped = weights if delta is None else weights.clamp(max=delta)
    loss = -torch.min(capped * advantages, clipped * advantages)
    bound = {"low": (weights < 1 - cliprange) & (advantages < 0), "high": (weights > 1 + high) & (advantages > 0)}
    return loss, bound


def flag_share(where: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of the loss tokens ``mask`` [B, C] where ``where`` ([B, C], [B, 1] or [B]) holds."""
    where = where.expand(mask.shape) if where.dim() == 2 else where.unsqueeze(-1).expand(mask.shape)
    return masked_mean(where.float(), mask.float()).item()


def clip_metrics(bound: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """Shares of the loss tokens where the clip binds: ``clip_ratio/low_mean``, ``/high_mean``, ``/region_mean``
    (TRL's names) and ``clip_ratio`` (the region's, steadyrl's name)."""
    region = flag_share(bound["low"] | bound["high"], mask)
    return {
        "clip_ratio/low_mean": flag_share(bound["low"], mask),
        "clip_ratio/high_mean": flag_share(bound["high"], mask),
        "clip_ratio/region_mean": region,
        "clip_ratio": region,
    }


def engine_importance_weights(
    logprobs: torch.Tensor,  # [N, C] the trainer's, of the sampling policy
    engine_logprobs: torch.Tensor,  # [N, C] the generation engine's (vLLM), of the same tokens
    mask: torch.Tensor,  # [N, C]
    mode: str,
    clip_max: float | None,
    clip_min: float | None = None,
) -> torch.Tensor:
    """Truncated (or masked) importance sampling for the engine/trainer mismatch (Yao et al., 2025; TRL's
    ``vllm_importance_sampling_correction``): pi_trainer / pi_engine per token [N, C] or per sequence [N, 1];
    ``*_truncate`` clamps it into [clip_min, clip_max], ``*_mask`` sets it to 0 outside."""
    diff = torch.nan_to_num((logprobs - engine_logprobs) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def importance_ratio_metrics(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Min, mean and max of the engine importance weights [N, C] or [N, 1] over the loss tokens ``mask`` [N, C]
    (TRL's ``sampling/importance_sampling_ratio/*``); none where there is no loss token."""
    values = weights.expand(mask.shape)[mask.bool()] if weights.shape[1] > 1 else weights.flatten()
    if not values.numel():
        return {}
    name = "sampling/importance_sampling_ratio"
    return {
        f"{name}/min": values.min().item(),
        f"{name}/mean": values.mean().item(),
        f"{name}/max": values.max().item(),
    }


# ---- objectives ----------------------------------------------------------------------------------------------------


class PolicyLoss:
    """A per-token policy objective: log-probs [B, C] of the policy being trained, of the one that sampled
    (``old_logprobs`` [B, C]), advantages [B] (one per sequence), the loss mask [B, C] and the ``LossSettings`` in;
    a ``TokenLoss`` out. ``reads``: which of the token-level options (``TOKEN_OPTIONS``) it honours; the config
    refuses the others. ``metrics`` turns its flags into logged numbers.

    Args (of ``__call__``):
        logprobs: [B, C] under the policy being trained (with gradients).
        old_logprobs: [B, C] under the policy that sampled.
        advantages: [B] one per sequence.
        mask: [B, C] the tokens the loss counts.
        settings: ``LossSettings``.

    Example::

        out = ClippedSurrogate()(logprobs, old_logprobs, advantages, mask, LossSettings(cliprange=0.2))
        out.loss.shape  # [B, C]
    """

    description: ClassVar[str] = ""
    reads: ClassVar[frozenset[str]] = TOKEN_OPTIONS

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        settings: LossSettings,
    ) -> TokenLoss:
        raise NotImplementedError

    def metrics(self, flags: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
        """Each flag's share of the loss tokens, under its name."""
        return {name: flag_share(where, mask) for name, where in flags.items()}


class ClippedSurrogate(PolicyLoss):
    """PPO's clipped surrogate (Schulman et al., 2017) with clip-higher (``cliprange_high``, Yu et al., 2025), per
    token or per sequence (``importance_sampling_level="sequence"``, GSPO: Zheng et al., 2025), and ``delta``'s
    two-sided clipping (INTELLECT-2, Prime Intellect, 2025)."""

    description = "the clipped surrogate"

    def __call__(self, logprobs, old_logprobs, advantages, mask, settings):
        log_weights = importance_log_weights(logprobs, old_logprobs, mask, settings.importance_sampling_level)
        loss, bound = clipped_surrogate(
            log_weights, advantages.unsqueeze(1), settings.cliprange, settings.cliprange_high, settings.delta
        )
        return TokenLoss(loss, log_weights, bound)

    def metrics(self, flags, mask):
        return clip_metrics(flags, mask)


class SequenceRatio(ClippedSurrogate):
    """TRL's RLOO loss (Ahmadian et al., 2024): the clipped surrogate of one importance ratio per sequence,
    exp of its summed token log-ratios; [B, 1]."""

    description = "TRL's RLOO loss, one importance ratio per sequence"
    reads = frozenset()

    def __call__(self, logprobs, old_logprobs, advantages, mask, settings):
        mask = mask.to(logprobs.dtype)
        log_ratio = ((logprobs - old_logprobs) * mask).sum(1, keepdim=True)  # [B, 1]
        loss, bound = clipped_surrogate(log_ratio, advantages.unsqueeze(1), settings.cliprange, settings.cliprange_high)
        return TokenLoss(loss, log_ratio, bound)


class CISPO(PolicyLoss):
    """CISPO (MiniMax-M1: MiniMax, 2025), as TRL's ``loss_type="cispo"``: REINFORCE weighted by the importance weight
    clipped from above and detached, l = -sg(min(w, eps_max)) A log pi, w per token or per sequence. eps_max is
    ``cliprange_high`` (TRL's ``epsilon_high``; default ``cliprange``) as a bound on w itself, not on w - 1: ScaleRL
    (Khatri et al., 2025) recommends 5.0. Logged: ``cispo_clip_ratio``, the share of tokens with w > eps_max, A > 0."""

    description = "CISPO: -min(w, epsilon_high) x A x log-prob, the weight detached"
    reads = frozenset({"importance_sampling_level", "vllm_importance_sampling_correction"})

    def __call__(self, logprobs, old_logprobs, advantages, mask, settings):
        log_weights = importance_log_weights(logprobs, old_logprobs, mask, settings.importance_sampling_level)
        weights, advantages = torch.exp(log_weights), advantages.unsqueeze(1)  # [B, C] or [B, 1]; [B, 1]
        loss = -weights.clamp(max=settings.high).detach() * advantages * logprobs  # [B, C]
        return TokenLoss(loss, log_weights, {"cispo_clip_ratio": (weights > settings.high) & (advantages > 0)})


class SAPO(PolicyLoss):
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347, 2025), as TRL's ``loss_type="sapo"``: a smooth gate
    in place of the hard clip, l = -sigmoid(tau (w - 1)) x 4 / tau x A, whose gradient in w is A at w = 1 and fades
    as w leaves it; tau is ``sapo_temperature_pos`` where A > 0, ``sapo_temperature_neg`` elsewhere (a higher one
    fades faster), w per token or per sequence."""

    description = "SAPO: -sigmoid(tau x (w - 1)) x 4 / tau x A, tau by the advantage's sign"
    reads = frozenset({"importance_sampling_level", "vllm_importance_sampling_correction"})

    def __call__(self, logprobs, old_logprobs, advantages, mask, settings):
        log_weights = importance_log_weights(logprobs, old_logprobs, mask, settings.importance_sampling_level)
        advantages = advantages.unsqueeze(1)  # [B, 1]
        tau = torch.where(advantages > 0, settings.sapo_temperature_pos, settings.sapo_temperature_neg)
        loss = -torch.sigmoid(tau * (torch.exp(log_weights) - 1)) * 4 / tau * advantages
        return TokenLoss(loss, log_weights, {})


# ---- aggregations --------------------------------------------------------------------------------------------------


class Aggregation:
    """How a per-token loss [B, C] or [B, 1] becomes the micro-batch's loss, over the loss mask [B, C].
    ``step_tokens``: it divides by ``tokens_per_micro_batch``, the rollout's loss tokens per micro-batch (over
    every process), which the trainer computes with the advantages.

    Example::

        TokenMean()(per_token_loss, mask, LossSettings())  # a scalar
    """

    description: ClassVar[str] = ""
    step_tokens: ClassVar[bool] = False

    def __call__(
        self,
        per_token_loss: torch.Tensor,
        mask: torch.Tensor,
        settings: LossSettings,
        tokens_per_micro_batch: float | torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError


class SequenceMean(Aggregation):
    description = "mean over sequences of each sequence's token mean"

    def __call__(self, per_token_loss, mask, settings, tokens_per_micro_batch=None):
        mask = mask.to(per_token_loss.dtype)
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


class TokenMean(Aggregation):
    description = "token mean over the micro-batch"

    def __call__(self, per_token_loss, mask, settings, tokens_per_micro_batch=None):
        mask = mask.to(per_token_loss.dtype)
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


class FixedLengthSum(Aggregation):
    description = "token sum / (sequences x max_completion_length)"

    def __call__(self, per_token_loss, mask, settings, tokens_per_micro_batch=None):
        masked = per_token_loss * mask.to(per_token_loss.dtype)
        return masked.sum() / (masked.shape[0] * settings.max_completion_length)


class StepTokenMean(Aggregation):
    description = "token mean over the whole optimizer step, across gradient accumulation and processes"
    step_tokens = True

    def __call__(self, per_token_loss, mask, settings, tokens_per_micro_batch=None):
        masked = per_token_loss * mask.to(per_token_loss.dtype)
        return masked.sum() / torch.as_tensor(tokens_per_micro_batch).clamp(min=1.0)


class BatchMean(Aggregation):
    description = "mean over the sequences"

    def __call__(self, per_token_loss, mask, settings, tokens_per_micro_batch=None):
        return per_token_loss.mean()  # [B, 1]: one term per sequence, whatever its tokens


class SequenceSum(Aggregation):
    description = "mean over sequences of each sequence's token sum (a sequence's weight grows with its length)"

    def __call__(self, per_token_loss, mask, settings, tokens_per_micro_batch=None):
        return (per_token_loss * mask.to(per_token_loss.dtype)).sum(-1).mean()


# ---- the registry --------------------------------------------------------------------------------------------------


class RegisteredLoss(NamedTuple):
    """A ``loss_type``: its objective and aggregation. ``shared``: accepted by GRPOConfig and RLOOConfig alike;
    else only by a config that names it in ``extra_loss_types`` (RLOO's own ``rloo``).

    Example::

        POLICY_LOSSES["my_loss"] = RegisteredLoss(MyObjective(), TokenMean())
        loss, metrics = POLICY_LOSSES["my_loss"](logprobs, old_logprobs, advantages, mask, LossSettings())
    """

    objective: PolicyLoss
    aggregation: Aggregation
    shared: bool = True

    @property
    def description(self) -> str:
        return f"{self.objective.description}, {self.aggregation.description}"

    def __call__(
        self,
        logprobs: torch.Tensor,  # [B, C]
        old_logprobs: torch.Tensor,  # [B, C]
        advantages: torch.Tensor,  # [B]
        mask: torch.Tensor,  # [B, C]
        settings: LossSettings,
        engine_weights: torch.Tensor | None = None,  # [B, C] or [B, 1]: pi_trainer / pi_vLLM, truncated
        kl: torch.Tensor | None = None,  # [B, C]: GRPO's KL term, added with coefficient settings.beta
        tokens_per_micro_batch: float | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's loss and metrics: the objective's per-token loss, times the engine weights, plus
        beta x KL (times w with ``use_bias_correction_kl``), aggregated (TRL's order)."""
        out = self.objective(logprobs, old_logprobs, advantages, mask, settings)
        per_token = out.loss
        if engine_weights is not None:
            per_token = per_token * engine_weights
        if kl is not None:
            if settings.use_bias_correction_kl:
                kl = kl * torch.exp(out.log_weights)
            per_token = per_token + settings.beta * kl
        loss = self.aggregation(per_token, mask, settings, tokens_per_micro_batch)
        return loss, self.objective.metrics(out.flags, mask)


POLICY_LOSSES: dict[str, RegisteredLoss] = {
    "grpo": RegisteredLoss(ClippedSurrogate(), SequenceMean()),
    "bnpo": RegisteredLoss(ClippedSurrogate(), TokenMean()),
    "dr_grpo": RegisteredLoss(ClippedSurrogate(), FixedLengthSum()),
    "dapo": RegisteredLoss(ClippedSurrogate(), StepTokenMean()),
    "rloo": RegisteredLoss(SequenceRatio(), BatchMean(), shared=False),
    "cispo": RegisteredLoss(CISPO(), StepTokenMean()),
    "sapo": RegisteredLoss(SAPO(), SequenceMean()),
    "luspo": RegisteredLoss(ClippedSurrogate(), SequenceSum()),  # LUSPO: GSPO's weights, each sequence x its length
}
