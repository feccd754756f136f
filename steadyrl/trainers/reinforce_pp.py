"""REINFORCE++ and REINFORCE++-baseline (Hu, 2025, arXiv 2501.03262), as OpenRLHF's ``advantage_estimator``
``reinforce`` / ``reinforce_baseline`` (verl: ``reinforce_plus_plus`` / ``reinforce_plus_plus_baseline``).

Shapes: N sequences (P prompts x k samples), C completion tokens.

    s_i = clip(score_i [- mean score of its prompt's k samples: reinforce_baseline])
    r_t = -init_kl_coef * KL_t  (+ s_i at the last completion token)      KL_t: kl_estimator's, per token
    G_t = r_t + gamma G_{t+1}                                               one return per token, no critic
    A_t = (G_t - mean) / std                 over every completion token of the rollout, every process's
    loss = loss_type's (ops.POLICY_LOSSES): the clipped surrogate of A_t per token, token mean over the optimizer
           step (dapo, OpenRLHF's token-level loss), ...

docs/reinforce_pp.md maps OpenRLHF's and verl's flags to these fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..ops import KL_ESTIMATORS, POLICY_LOSSES, REINFORCE_PP_ESTIMATORS, approx_kl, masked_mean, reinforce_pp_advantages
from ..rollout import Advantages, Rollout
from .config.on_policy_config import OnPolicyConfig
from .config.policy_loss import PolicyLossOptions
from .config.trl_names import Synonym, views_of
from .loop.on_policy import OnPolicyTrainer
from .loop.policy_loss import PolicyGradient

INIT_KL_COEF = Synonym("init_kl_coef", "beta", "the KL coefficient")
# the registered losses that take one advantage per token
TOKEN_ADVANTAGE_LOSSES = tuple(
    name for name, loss in POLICY_LOSSES.items() if loss.shared and loss.objective.takes_token_advantages
)


@views_of(INIT_KL_COEF)
@dataclass
class ReinforcePPConfig(PolicyLossOptions, OnPolicyConfig):
    """``OnPolicyConfig`` plus REINFORCE++'s options, with OpenRLHF's names and defaults where it has them
    (``init_kl_coef`` is a view of ``beta``: one value). Each field's ``help`` describes it (docs/configuration.md
    lists them).

    Example::

        ReinforcePPConfig(output_dir="out", advantage_estimator="reinforce_baseline", n_samples_per_prompt=8,
                          rollout_batch_size=64, train_batch_size=512, init_kl_coef=0.01, learning_rate=5e-7)
    """

    settings_group: ClassVar[str] = "REINFORCE++"

    advantage_estimator: str = field(
        default="reinforce",
        metadata={
            "help": "OpenRLHF's advantage_estimator: 'reinforce' (REINFORCE++; verl's reinforce_plus_plus) or "
            "'reinforce_baseline' (REINFORCE++-baseline: each score less its prompt's mean score first; needs "
            "n_samples_per_prompt >= 2; verl's reinforce_plus_plus_baseline)."
        },
    )
    gamma: float = field(
        default=1.0,
        metadata={"help": "Discount of the per-token returns, in (0, 1] (OpenRLHF's default 1; 'reinforce' only)."},
    )
    beta: float = field(
        default=0.01,
        metadata={
            "help": "KL coefficient of the per-token KL penalty in the reward (OpenRLHF's init_kl_coef, also "
            "accepted, and its default 0.01); 0: no reference model."
        },
    )
    init_kl_coef: float | None = field(default=None, metadata={"help": "OpenRLHF's name of beta."})
    kl_estimator: str = field(
        default="k1",
        metadata={
            "help": "Per-token KL estimator in the reward, clamped to [-10, 10]: k1, k2 or k3 (OpenRLHF's default "
            "and recommendation for a KL in the reward: k1)."
        },
    )
    reward_clip_range: list[float] | None = field(
        default_factory=lambda: [-10.0, 10.0],
        metadata={
            "help": "(min, max): clip each score (reinforce_baseline: after the prompt's mean is taken off) to "
            "this range (OpenRLHF's default (-10, 10)); None: no clipping."
        },
    )
    no_advantage_std_norm: bool = field(
        default=False,
        metadata={"help": "Only centre the advantages over the rollout, do not divide by their std (OpenRLHF's)."},
    )
    loss_type: str = field(
        default="dapo",
        metadata={
            "help": "The policy loss, one that takes an advantage per token (default dapo: OpenRLHF's token-level "
            "loss, a token mean over the optimizer step): "
            + "; ".join(f"{name} ({POLICY_LOSSES[name].description})" for name in TOKEN_ADVANTAGE_LOSSES)
            + "."
        },
    )

    def __post_init__(self):
        self.beta = resolve_init_kl_coef(INIT_KL_COEF.take(self), self.beta)
        super().__post_init__()
        if self.loss_type in POLICY_LOSSES and self.loss_type not in TOKEN_ADVANTAGE_LOSSES:
            raise ValueError(
                f"loss_type={self.loss_type!r} takes one advantage per sequence, and REINFORCE++ gives one per "
                f"token: use one of {', '.join(TOKEN_ADVANTAGE_LOSSES)}."
            )
        self._check_policy_loss()
        self._check_reinforce_pp()

    def _check_reinforce_pp(self) -> None:
        if self.advantage_estimator not in REINFORCE_PP_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator={self.advantage_estimator!r} is invalid: use 'reinforce' or 'reinforce_baseline'."
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator={self.kl_estimator!r} is invalid: use one of {', '.join(KL_ESTIMATORS)}.")
        if not (isinstance(self.gamma, (int, float)) and 0 < self.gamma <= 1):
            raise ValueError(f"gamma={self.gamma!r} is invalid: it must be in (0, 1].")
        baseline = self.advantage_estimator == "reinforce_baseline"
        if baseline and self.gamma != 1:
            raise ValueError(
                f"gamma={self.gamma} does not apply to advantage_estimator='reinforce_baseline', whose baseline is "
                "the prompt's mean score of whole sequences (OpenRLHF sets it to 1): use gamma=1.0."
            )
        if baseline and self.n_samples_per_prompt < 2:
            raise ValueError(
                f"n_samples_per_prompt={self.n_samples_per_prompt} is too few for advantage_estimator="
                "'reinforce_baseline': its baseline is the mean score of a prompt's samples, so every advantage "
                "would be 0. Use n_samples_per_prompt >= 2, or advantage_estimator='reinforce'."
            )
        self.reward_clip_range = checked_clip_range(self.reward_clip_range)


def resolve_init_kl_coef(init_kl_coef: float | None, beta: float) -> float:
    """``beta``, or OpenRLHF's ``init_kl_coef`` where given; both given with different values is refused."""
    if init_kl_coef is None:
        return beta
    if beta not in (0.01, init_kl_coef):
        raise ValueError(
            f"init_kl_coef={init_kl_coef!r} contradicts beta={beta!r}: both set the KL coefficient (init_kl_coef is "
            "OpenRLHF's name of beta); give one of them."
        )
    return init_kl_coef


def checked_clip_range(bounds) -> tuple[float, float] | None:
    if bounds is None:
        return None
    numbers = isinstance(bounds, (list, tuple)) and len(bounds) == 2
    numbers = numbers and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
    if not (numbers and math.isfinite(bounds[0]) and math.isfinite(bounds[1]) and bounds[0] < bounds[1]):
        raise ValueError(
            f"reward_clip_range={bounds!r} is invalid: give (min, max), two finite numbers with min < max (None: no "
            "clipping)."
        )
    return float(bounds[0]), float(bounds[1])


class ReinforcePP(PolicyGradient):
    """REINFORCE++'s advantages (ops.reinforce_pp_advantages: one per token) and the ``loss_type`` family's loss.
    Built by ``ReinforcePPTrainer``.

    Example::

        ReinforcePP(ReinforcePPConfig(output_dir="out"), Processes(accelerator), tokenizer.eos_token_id, model)
    """

    def needs_old_logprobs(self) -> bool:
        return super().needs_old_logprobs() or self.args.beta > 0  # the KL penalty is part of the reward

    def advantages(self, rollout: Rollout) -> Advantages:
        args, mask = self.args, rollout.policy_mask  # [N, C]
        if rollout.ref_logprobs is None or rollout.old_logprobs is None:  # beta is 0: no KL penalty
            token_kl = torch.zeros_like(mask, dtype=rollout.scores.dtype)
        else:
            token_kl = approx_kl(rollout.old_logprobs, rollout.ref_logprobs, args.kl_estimator) * mask  # [N, C]
        baseline = args.advantage_estimator == "reinforce_baseline"
        advantages, _ = reinforce_pp_advantages(
            rollout.scores,
            token_kl,
            mask,
            args.beta,
            args.gamma,
            group_size=args.n_samples_per_prompt if baseline else None,
            std_norm=not args.no_advantage_std_norm,
            sum_over_processes=self.processes.sum,  # whitened over the whole rollout
            clip=args.reward_clip_range,
        )
        kl = token_kl.sum(1)  # [N]
        metrics = {"kl": kl.mean().item(), "rlhf_reward": (rollout.scores - args.beta * kl).mean().item()}
        return self.with_step_tokens(rollout, advantages, metrics)

    def loss(self, model, batch: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        mask = self.loss_mask(batch)  # [B, C]
        logprobs, entropy, outputs = self.policy_loss.logprobs(model, batch)
        loss, metrics = self.policy_loss(logprobs, batch, mask)  # loss_type's, with the per-token advantages
        loss, aux_metrics = self.policy_loss.with_aux_loss(loss, outputs)  # a Mixture-of-Experts model's balancing
        return loss, {**metrics, **aux_metrics, "entropy": masked_mean(entropy.detach(), mask).item()}


class ReinforcePPTrainer(OnPolicyTrainer):
    """REINFORCE++ on the shared on-policy loop; arguments as ``OnPolicyTrainer``'s (TRL's).

    Example::

        trainer = ReinforcePPTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=[my_reward],
                                     args=ReinforcePPConfig(output_dir="out"), train_dataset=prompts)
        trainer.train(resume_from_checkpoint=True)
    """

    algorithm_name = "reinforce-pp"
    config_class = ReinforcePPConfig
    algorithm_class = ReinforcePP

    def algorithm_inputs(self) -> tuple:
        return (self.model,)
