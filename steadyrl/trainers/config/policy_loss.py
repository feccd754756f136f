"""TRL's policy-loss options, shared by GRPO and RLOO: ``loss_type``, GSPO's sequence-level importance weights,
two-sided clipping (``delta``) and the truncated importance-sampling correction for vLLM's log-probs.

``PolicyLossOptions`` declares and checks the fields (a mixin of the algorithms' configs), the hyperparameters of the
registered losses among them (SAPO's, VESPO's: each read and checked by its loss alone); the algorithms' policy-loss
part (trainers/loop/policy_loss.py) builds the loss once. The losses, and the names ``loss_type`` accepts, are
``ops.POLICY_LOSSES``: a loss registered there is accepted without a change here, and checks its own settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...generation import backend_class
from ...ops import (
    ENGINE_CORRECTION_MODES,
    IMPORTANCE_SAMPLING_LEVELS,
    POLICY_LOSSES,
)
from .value_checks import finite


def accepted_loss_types(extra: tuple[str, ...] = ()) -> list[str]:
    """The ``loss_type`` names a config accepts: every shared registered loss, and those of ``extra`` (its own)."""
    return [name for name, loss in POLICY_LOSSES.items() if loss.shared or name in extra]


def loss_type_help(extra: tuple[str, ...] = ()) -> str:
    """``loss_type``'s help: each accepted loss (``extra``: the config's own) and what it computes."""
    losses = "; ".join(f"{name} ({POLICY_LOSSES[name].description})" for name in accepted_loss_types(extra))
    return f"The policy loss (a per-token objective, then how a micro-batch's tokens are reduced): {losses}."


@dataclass
class PolicyLossOptions:
    """The policy-loss fields of ``GRPOConfig`` and ``RLOOConfig`` (TRL's names and meanings); each field's ``help``
    describes it (docs/configuration.md lists them).

    Example::

        GRPOConfig(output_dir="out", loss_type="dr_grpo", epsilon_high=0.28, use_vllm=True,
                   vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate")
    """

    settings_group: ClassVar[str] = "Policy loss (GRPO and RLOO)"

    loss_type: str = field(default="dapo", metadata={"help": loss_type_help()})
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
    router_aux_loss_coef: float | None = field(
        default=None,
        metadata={
            "help": "Weight of a Mixture-of-Experts model's load-balancing loss, added to the loss as TRL does; None: "
            "the model config's own router_aux_loss_coef (0 where it has none), 0.0: none. Refused for a model "
            "that is not a Mixture-of-Experts one."
        },
    )

    sapo_temperature_neg: float = field(
        default=1.05, metadata={"help": "loss_type='sapo': the gate's temperature where the advantage is <= 0."}
    )
    sapo_temperature_pos: float = field(
        default=1.0, metadata={"help": "loss_type='sapo': the gate's temperature where the advantage is > 0."}
    )
    vespo_k_pos: float = field(
        default=2.0, metadata={"help": "loss_type='vespo': the Gamma weight's shape k where the advantage is >= 0."}
    )
    vespo_lambda_pos: float = field(
        default=3.0, metadata={"help": "loss_type='vespo': the Gamma weight's rate lambda where the advantage is >= 0."}
    )
    vespo_k_neg: float = field(
        default=3.0, metadata={"help": "loss_type='vespo': the Gamma weight's shape k where the advantage is < 0."}
    )
    vespo_lambda_neg: float = field(
        default=2.0, metadata={"help": "loss_type='vespo': the Gamma weight's rate lambda where the advantage is < 0."}
    )

    extra_loss_types: ClassVar[tuple[str, ...]] = ()  # the registered losses only this algorithm accepts
    # Whether the importance ratio weighs a KL term in the loss: GRPO's field (TRL's use_bias_correction_kl) replaces
    # this default; the others' KL is in the reward, so their loss has no KL term to weigh.
    use_bias_correction_kl = False

    def _check_policy_loss(self) -> None:
        """Check the fields above (after the TRL synonyms are resolved)."""
        choices = accepted_loss_types(self.extra_loss_types)
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
        if self.router_aux_loss_coef is not None and not finite(self.router_aux_loss_coef):
            raise ValueError(f"router_aux_loss_coef={self.router_aux_loss_coef!r} is invalid: give a finite number.")
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
        self._check_loss_reads_options()
        POLICY_LOSSES[self.loss_type].check(self)  # the loss's own settings (SAPO's temperatures, VESPO's modes)

    def _check_loss_reads_options(self) -> None:
        """Refuse a token-level option (``ops.TOKEN_OPTIONS``) set for a loss whose objective does not read it."""
        objective = POLICY_LOSSES[self.loss_type].objective
        given = {
            "importance_sampling_level": self.importance_sampling_level != "token",
            "delta": self.delta is not None,
            "vllm_importance_sampling_correction": self.vllm_importance_sampling_correction,
        }
        for name, set_ in given.items():
            if set_ and name not in objective.reads:
                names = accepted_loss_types(self.extra_loss_types)
                readers = [other for other in names if name in POLICY_LOSSES[other].objective.reads]
                raise ValueError(
                    f"{name}={getattr(self, name)!r} does not apply to loss_type={self.loss_type!r} "
                    f"({objective.description}): leave it unset, or use a loss_type that reads it "
                    f"({', '.join(readers)})."
                )
