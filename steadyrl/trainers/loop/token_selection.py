"""TRL 1.16's GRPO options for which tokens the policy loss trains on and its entropy bonus: ``top_entropy_quantile``
(entropy masking), ``off_policy_mask_threshold`` (off-policy sequence masking), ``entropy_coef`` and
``use_adaptive_entropy`` (an entropy bonus, fixed or adaptive).

``TokenSelectionOptions`` declares and checks the fields (a mixin of GRPOConfig); ``TokenSelectionMixin`` applies
them to a micro-batch (a mixin of GRPOTrainer). The math is ops/token_selection.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ...ops.token_selection import (
    EntropyControl,
    adaptive_entropy_coef,
    entropy_bonus,
    high_entropy_mask,
    off_policy_mask,
)
from ...rollout import Rollout
from ..config.value_checks import finite


@dataclass
class TokenSelectionOptions:
    """GRPOConfig's entropy-masking, off-policy-masking and entropy-bonus fields (TRL 1.16's names and defaults).

    Example::

        GRPOConfig(output_dir="out", top_entropy_quantile=0.2, off_policy_mask_threshold=0.5,
                   entropy_coef=0.001, use_adaptive_entropy=True, entropy_target=2.0)
    """

    settings_group: ClassVar[str] = "Token selection and entropy bonus (GRPO)"

    top_entropy_quantile: float = field(
        default=1.0,
        metadata={
            "help": "rho of 'Beyond the 80/20 Rule' (Wang et al., 2025): the policy loss keeps only the tokens whose "
            "entropy is in the top rho quantile of the micro-batch's loss tokens (taken over every process's micro-"
            "batch, as TRL); 1.0 keeps all, 0.0 only the highest-entropy token(s)."
        },
    )
    entropy_coef: float = field(
        default=0.0,
        metadata={
            "help": "Coefficient of an entropy bonus: loss = policy loss - entropy_coef x the mean entropy of the "
            "trained tokens (the same meaning for every loss_type). With use_adaptive_entropy: the initial value."
        },
    )
    use_adaptive_entropy: bool = field(
        default=False,
        metadata={
            "help": "Adapt entropy_coef after every optimizer step (Skywork-OR1, He et al., 2025): + entropy_coef_delta"
            " where the step's mean entropy is <= entropy_target, - otherwise; the bonus applies only while the last "
            "step's entropy is <= entropy_target. The coefficient is checkpointed."
        },
    )
    entropy_coef_min: float = field(default=0.0, metadata={"help": "use_adaptive_entropy: the lowest coefficient."})
    entropy_coef_max: float = field(default=1.0, metadata={"help": "use_adaptive_entropy: the highest coefficient."})
    entropy_coef_delta: float = field(
        default=0.005, metadata={"help": "use_adaptive_entropy: the coefficient's change per optimizer step."}
    )
    entropy_target: float = field(
        default=0.2,
        metadata={
            "help": "use_adaptive_entropy: the target mean entropy (nats) over the trained tokens. Language models "
            "start at 2-10 nats; set it near the 'entropy' logged early in training."
        },
    )
    off_policy_mask_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Off-policy sequence masking (DeepSeek-V3.2, 2025, Eq. 9): drop from the loss a sequence with a "
            "negative advantage whose mean log(pi_sampling / pi) over its tokens exceeds this (e.g. 0.5); pi_sampling "
            "is vLLM's log-probs where it reported them. None: off."
        },
    )

    def _check_token_selection(self) -> None:
        """Check the fields above: each names the value and what would be valid."""
        if not (finite(self.top_entropy_quantile) and 0.0 <= self.top_entropy_quantile <= 1.0):
            raise ValueError(
                f"top_entropy_quantile={self.top_entropy_quantile!r} is invalid: it is the share of tokens kept by "
                "entropy, a number in [0, 1] (1.0: all tokens)."
            )
        for name in ("entropy_coef", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"):
            if not finite(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: it must be a finite number.")
        if self.use_adaptive_entropy:
            if not 0 <= self.entropy_coef_min <= self.entropy_coef_max:
                raise ValueError(
                    f"entropy_coef_min={self.entropy_coef_min} and entropy_coef_max={self.entropy_coef_max} are "
                    "invalid: use_adaptive_entropy keeps the coefficient within them, so 0 <= entropy_coef_min <= "
                    "entropy_coef_max."
                )
            if self.entropy_coef_delta < 0:
                raise ValueError(
                    f"entropy_coef_delta={self.entropy_coef_delta} is invalid: it is the coefficient's step, >= 0."
                )
        threshold = self.off_policy_mask_threshold
        if threshold is not None and not (finite(threshold) and threshold >= 0):
            raise ValueError(
                f"off_policy_mask_threshold={threshold!r} is invalid: it bounds a mean KL estimate, so a finite "
                "number >= 0 (e.g. 0.5), or None to turn the masking off."
            )

    @property
    def entropy_bonus_on(self) -> bool:
        return self.entropy_coef != 0.0 or self.use_adaptive_entropy


class EntropyCoefficient:
    """The entropy bonus's coefficient and the mean entropy of the last optimizer step (None before the first), as
    ``use_adaptive_entropy`` changes them: part of GRPO's checkpointed algorithm state."""

    def __init__(self, coef: float) -> None:
        self.coef, self.last_entropy = coef, None

    def applied(self, args) -> float:
        """The coefficient every micro-batch of this step applies: with ``use_adaptive_entropy`` only once the last
        step's entropy is at or below ``entropy_target``."""
        if not args.use_adaptive_entropy:
            return self.coef
        return self.coef if self.last_entropy is not None and self.last_entropy <= args.entropy_target else 0.0

    def state_dict(self) -> dict:
        return {"entropy_coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict) -> None:
        self.coef = state.get("entropy_coef", self.coef)
        self.last_entropy = state.get("last_entropy")


class TokenSelectionMixin:
    """The token-selection part of GRPOTrainer: the masks a micro-batch's policy loss is multiplied by, and the
    entropy bonus with its (adaptive) coefficient."""

    _entropy_window: torch.Tensor | None = None  # [2]: sum of entropies and tokens over this step's micro-batches

    @property
    def entropy_coef(self) -> float:
        """TRL's attribute: the entropy bonus's coefficient now (``use_adaptive_entropy`` moves it each step)."""
        return self.algorithm_state.coef

    @property
    def reads_engine_logprobs(self) -> bool:
        return self.args.off_policy_mask_threshold is not None

    def initial_algorithm_state(self) -> EntropyCoefficient:
        return EntropyCoefficient(self.args.entropy_coef)

    def pooled_over_processes(self, values: torch.Tensor) -> torch.Tensor:
        """Every process's ``values`` [n_i] of this micro-batch, concatenated (this process's alone on one)."""
        if self.accelerator.num_processes == 1:
            return values
        sentinel = -1e9  # entropies are >= 0, so no real value equals it
        padded = self.accelerator.pad_across_processes(values, dim=0, pad_index=sentinel)
        gathered = self.accelerator.gather(padded)
        return gathered[gathered != sentinel]

    def selected_tokens(
        self, logprobs: torch.Tensor, entropy: torch.Tensor, batch: Rollout, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """What the per-token policy loss is multiplied by ([B, C], or None: every token), and the tokens [B, C] the
        entropy bonus averages over (the loss mask, less the entropy mask's zeros)."""
        args, keep, selected = self.args, None, mask
        if args.off_policy_mask_threshold is not None:
            sampled = batch.engine_logprobs if batch.engine_logprobs is not None else batch.old_logprobs
            sampled = logprobs.detach() if sampled is None else sampled  # trained once: the sampling policy's own
            keep = off_policy_mask(batch.advantages, logprobs, sampled, mask, args.off_policy_mask_threshold)
        if args.top_entropy_quantile < 1.0:
            pooled = self.pooled_over_processes(entropy.detach()[mask.bool()].float())
            high = high_entropy_mask(entropy.detach(), mask, 1 - args.top_entropy_quantile, pooled).to(mask.dtype)
            keep, selected = (high if keep is None else keep * high), mask * high
        return keep, selected

    def with_entropy_bonus(
        self, model, loss: torch.Tensor, entropy: torch.Tensor, selected: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``loss`` less the entropy bonus (``entropy_coef``), and the policy loss alone as a metric; ``loss``
        unchanged without one. In training, the step's entropy over the trained tokens is summed for the adaptive
        coefficient."""
        if not self.args.entropy_bonus_on:
            return loss, {}
        if model.training:
            sums = torch.stack([(entropy.detach() * selected).sum(), selected.sum()]).double()
            self._entropy_window = sums if self._entropy_window is None else self._entropy_window + sums
        coef = self.algorithm_state.applied(self.args)
        return loss - coef * entropy_bonus(entropy, selected), {"policy_loss": loss.item()}

    def train_on_minibatch(self, minibatch: Rollout) -> dict[str, float]:
        """The step, then (``use_adaptive_entropy``) the coefficient for the next one; ``entropy_coef`` logged with
        any entropy bonus."""
        self._entropy_window = None
        metrics = super().train_on_minibatch(minibatch)
        if self.args.use_adaptive_entropy:
            self.update_entropy_coefficient()
        if self.args.entropy_bonus_on:
            metrics["entropy_coef"] = self.algorithm_state.coef
        return metrics

    def update_entropy_coefficient(self) -> None:
        """The adaptive coefficient from the step's mean entropy over every process's trained tokens."""
        if self._entropy_window is None:
            return
        args, state, total = self.args, self.algorithm_state, self.sum_over_processes()
        window = self._entropy_window if total is None else total(self._entropy_window)
        entropy = (window[0] / window[1].clamp(min=1.0)).item()
        self._entropy_window = None
        if self.learner.last_refused or not math.isfinite(entropy):  # a skipped step moves nothing, this neither
            return
        control = EntropyControl(
            args.entropy_coef_min, args.entropy_coef_max, args.entropy_coef_delta, args.entropy_target
        )
        state.coef, state.last_entropy = adaptive_entropy_coef(state.coef, entropy, control), entropy
