"""TRL's policy-loss options, shared by GRPO and RLOO: ``loss_type``, GSPO's sequence-level importance weights,
two-sided clipping (``delta``) and the truncated importance-sampling correction for vLLM's log-probs.

``PolicyLossOptions`` declares and checks the fields (a mixin of the algorithms' configs); ``PolicyLossMixin``
turns a micro-batch's log-probs into the loss (a mixin of the trainers). The math is in ``ops/policy_loss.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ...generation import backend_class
from ...ops import (
    ENGINE_CORRECTION_MODES,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    aggregate_token_loss,
    clip_metrics,
    clipped_surrogate,
    importance_log_weights,
)
from ...rollout import Rollout
from ..config.value_checks import finite


@dataclass
class PolicyLossOptions:
    """The policy-loss fields of ``GRPOConfig`` and ``RLOOConfig`` (TRL's names and meanings); each field's ``help``
    describes it (docs/configuration.md lists them).

    Example::

        GRPOConfig(output_dir="out", loss_type="dr_grpo", epsilon_high=0.28, use_vllm=True,
                   vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate")
    """

    settings_group: ClassVar[str] = "Policy loss (GRPO and RLOO)"

    loss_type: str = field(
        default="dapo",
        metadata={
            "help": "How per-token losses become a micro-batch's loss: grpo (per-sequence mean, then mean over "
            "sequences), bnpo (token mean over the micro-batch), dr_grpo (token sum / (sequences x "
            "max_completion_length)) or dapo (token mean over the whole optimizer step, across gradient "
            "accumulation and processes)."
        },
    )
    importance_sampling_level: str = field(
        default="token",
        metadata={
            "help": "'token' (PPO's ratio per token) or 'sequence' (GSPO: the geometric mean of the sequence's "
            "token ratios, one per sequence)."
        },
    )
    delta: float | None = field(
        default=None,
        metadata={
            "help": "Cap the unclipped importance ratio at delta as well (two-sided clipping, INTELLECT-2); "
            "None: no cap."
        },
    )
    vllm_importance_sampling_correction: bool = field(
        default=False,
        metadata={
            "help": "With use_vllm: weight each token's loss by pi_trainer / pi_vLLM of the sampled tokens "
            "(truncated importance sampling), correcting the engines' numeric mismatch. Off by default (TRL: "
            "on)."
        },
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask", metadata={"help": f"One of {', '.join(ENGINE_CORRECTION_MODES)}."}
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0, metadata={"help": "Upper bound of the vLLM importance ratio (truncate: clamp; mask: zero)."}
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None, metadata={"help": "Lower bound of the vLLM importance ratio; None: none."}
    )
    vllm_importance_sampling_cap: float | None = field(
        default=None, metadata={"help": "TRL's deprecated name of vllm_importance_sampling_clip_max."}
    )

    extra_loss_types: ClassVar[tuple[str, ...]] = ()  # the algorithm's own loss types, beyond LOSS_TYPES

    def _check_policy_loss(self) -> None:
        """Check the fields above (after the TRL synonyms are resolved)."""
        choices = LOSS_TYPES + self.extra_loss_types
        if self.loss_type not in choices:
            raise ValueError(f"loss_type={self.loss_type!r} is invalid: use one of {', '.join(choices)}.")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"importance_sampling_level={self.importance_sampling_level!r} is invalid: use 'token' or 'sequence'."
            )
        if self.delta is not None and not (finite(self.delta) and self.delta > 1):
            raise ValueError(
                f"delta={self.delta!r} is invalid: it caps the unclipped importance ratio, so it must be a finite "
                "number > 1, usually above 1 + epsilon_high (None: no cap)."
            )
        if self.vllm_importance_sampling_cap is not None:
            if self.vllm_importance_sampling_clip_max not in (3.0, self.vllm_importance_sampling_cap):
                raise ValueError(
                    f"vllm_importance_sampling_cap={self.vllm_importance_sampling_cap!r} contradicts "
                    f"vllm_importance_sampling_clip_max={self.vllm_importance_sampling_clip_max!r}: the first is "
                    "TRL's deprecated name of the second; give one of them."
                )
            self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
        if self.vllm_importance_sampling_mode not in ENGINE_CORRECTION_MODES:
            raise ValueError(
                f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r} is invalid: use one of "
                f"{', '.join(ENGINE_CORRECTION_MODES)}."
            )
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        for name, value in (("vllm_importance_sampling_clip_min", low), ("vllm_importance_sampling_clip_max", high)):
            if value is not None and not (finite(value) and value >= 0):
                raise ValueError(f"{name}={value!r} is invalid: it must be a finite number >= 0, or None.")
        if low is not None and high is not None and low >= high:
            raise ValueError(
                f"vllm_importance_sampling_clip_min={low} must be below vllm_importance_sampling_clip_max={high}."
            )
        if self.max_staleness and not self.vllm_importance_sampling_correction:
            raise ValueError(
                f"max_staleness={self.max_staleness} trains on rollouts sampled with weights up to "
                f"{self.max_staleness} rollout(s) old: set vllm_importance_sampling_correction=True, which weighs "
                "each token's loss by pi_trainer / pi_sampling (truncated) to correct for the lag."
            )
        sampling = backend_class(self.generation_backend).capabilities
        if self.vllm_importance_sampling_correction and not sampling.returns_logprobs:
            raise ValueError(
                "vllm_importance_sampling_correction=True needs use_vllm=True: it corrects for the difference "
                "between vLLM's log-probs and the trainer's, and HF generate samples with the trained model itself."
            )


class PolicyLossMixin:
    """The loss-family part of a GRPO or RLOO trainer."""

    checks_engine_in_loss = True

    def engine_weights_of(self, logprobs: torch.Tensor, batch: Rollout) -> tuple[torch.Tensor | None, dict]:
        """The batch's vLLM importance weights, and for a rollout trained once (it holds ``engine_logprobs``, no
        separate pass ran) the check and weights from this training pass's own ``logprobs`` [B, C], detached: the
        sampling policy's."""
        if batch.engine_logprobs is None:
            return batch.engine_weights, {}
        return self.engine_check(logprobs.detach(), batch.engine_logprobs, batch.policy_mask)

    def tokens_per_micro_batch(self, rollout: Rollout) -> torch.Tensor:
        """[N] (one value, repeated): the rollout's loss tokens, over every process, per micro-batch; ``dapo``
        divides each micro-batch's token sum by it."""
        tokens = self.loss_mask(rollout).sum().double()
        total = self.sum_over_processes()
        if total is not None:
            tokens = total(tokens.reshape(1))[0]
        micro_batches = len(rollout) // self.args.micro_train_batch_size * self.accelerator.num_processes
        return torch.full((len(rollout),), (tokens / micro_batches).item(), device=rollout.scores.device)

    def token_policy_loss(
        self, logprobs: torch.Tensor, batch: Rollout, kl: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped surrogate of ``logprobs`` [B, C] with the batch's advantages (one per sequence), weighted by
        the vLLM importance weights if any, plus ``beta`` x ``kl`` [B, C] (GRPO's KL term; with
        ``use_bias_correction_kl`` weighted by the importance ratio), aggregated as ``loss_type`` says."""
        args, mask = self.args, self.loss_mask(batch)  # [B, C]
        sampled = logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs  # trained once: the same
        log_weights = importance_log_weights(logprobs, sampled, mask, args.importance_sampling_level)
        advantages = batch.advantages.unsqueeze(1)  # [B, 1]
        per_token, bound = clipped_surrogate(log_weights, advantages, args.cliprange, args.cliprange_high, args.delta)
        engine_weights, engine_metrics = self.engine_weights_of(logprobs, batch)
        if engine_weights is not None:
            per_token = per_token * engine_weights
        if kl is not None:
            if getattr(args, "use_bias_correction_kl", False):
                kl = kl * torch.exp(log_weights)
            per_token = per_token + args.beta * kl
        normaliser = None if batch.tokens_per_micro_batch is None else batch.tokens_per_micro_batch[0]
        loss = aggregate_token_loss(per_token, mask, args.loss_type, args.max_completion_length, normaliser)
        return loss, {**clip_metrics(bound, mask), **engine_metrics}
