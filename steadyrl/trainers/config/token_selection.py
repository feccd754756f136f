"""TRL 1.16's GRPO options for which tokens the policy loss trains on and its entropy bonus: ``top_entropy_quantile``
(entropy masking), ``off_policy_mask_threshold`` (off-policy sequence masking), ``entropy_coef`` and
``use_adaptive_entropy`` (an entropy bonus, fixed or adaptive).

``TokenSelectionOptions`` declares and checks the fields (a mixin of GRPOConfig); GRPO's token-selection part
(trainers/loop/token_selection.py) applies them to a micro-batch. The math is ops/token_selection.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .value_checks import finite


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
