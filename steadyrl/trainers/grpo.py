"""GRPO: group-relative advantages (Shao et al., 2024) with TRL's loss family (DAPO, Dr. GRPO, GSPO options).

Shapes: P prompts x k samples = N sequences, C completion tokens.

    A_i = (r_i - mean of its group's k rewards) / (std of the group | std of the batch | 1)     scale_rewards
    l_t = loss_type's objective at token t, e.g. the clipped surrogate of A_i, times m_t (0 where
          top_entropy_quantile or off_policy_mask_threshold drops it)  (+ beta * KL_t, the k3 estimate vs the reference)
    loss = l aggregated as loss_type says (ops.POLICY_LOSSES: grpo, bnpo, dr_grpo, dapo, ...)
           - entropy_coef * mean entropy of the kept tokens (with an entropy bonus)

Unlike RLOO's, GRPO's KL term is part of the loss, not of the reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..ops import (
    SCALE_REWARDS,
    group_normalized_total,
    group_relative_advantages,
    kl_penalty,
    masked_mean,
    masked_moments,
    whiten,
    zero_std_groups,
)
from ..rollout import Advantages, Rollout
from .config.completions_hub import CompletionsHubOptions
from .config.dynamic_sampling import DynamicSamplingOptions
from .config.float32_head import Float32HeadOptions
from .config.on_policy_config import OnPolicyConfig
from .config.policy_loss import PolicyLossOptions
from .config.token_selection import TokenSelectionOptions
from .loop.algorithm import Processes
from .loop.on_policy import OnPolicyTrainer
from .loop.policy_loss import PolicyGradient
from .loop.token_selection import TokenSelection

AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
_NOT_HERE = "steadyrl's GRPO does not implement it"


@dataclass
class GRPOConfig(
    CompletionsHubOptions,
    Float32HeadOptions,
    TokenSelectionOptions,
    PolicyLossOptions,
    DynamicSamplingOptions,
    OnPolicyConfig,
):
    """``OnPolicyConfig`` plus GRPO's options, with TRL's names and defaults (``beta`` 0: no reference model at all;
    ``loss_type`` ``dapo``; 8 completions per prompt). Each field's ``help`` describes it (docs/configuration.md
    lists them).

    Example::

        GRPOConfig(output_dir="out", num_generations=4, per_device_train_batch_size=8, loss_type="dr_grpo",
                   scale_rewards="batch", epsilon_high=0.28, beta=0.04, save_steps=100)
    """

    settings_group: ClassVar[str] = "GRPO"
    _default_samples_per_prompt = 8

    scale_rewards: str = field(
        default="group",
        metadata={
            "help": "Divide the group-centred rewards by the std of the group ('group' or True), of the whole "
            "batch across processes ('batch'), or not at all ('none' or False, Dr. GRPO)."
        },
    )
    multi_objective_aggregation: str = field(
        default="sum_then_normalize",
        metadata={
            "help": "sum_then_normalize (weight and sum the rewards, then centre and scale) or "
            "normalize_then_sum (centre and scale each reward in its group, weight and sum, then normalise "
            "over the batch; GDPO)."
        },
    )
    use_bias_correction_kl: bool = field(
        default=True, metadata={"help": "Weight the KL term by the importance ratio (TRL's default True)."}
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient; 0 (TRL's default): no reference model."})

    def __post_init__(self):
        as_bool = {True: "group", False: "none", "true": "group", "false": "none"}  # TRL's booleans; the CLI's text
        key = self.scale_rewards.lower() if isinstance(self.scale_rewards, str) else self.scale_rewards
        self.scale_rewards = as_bool.get(key, self.scale_rewards)
        super().__post_init__()
        self._check_policy_loss()
        self._check_token_selection()
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} is invalid: use 'group' (or True), 'batch', or 'none' (or "
                "False)."
            )
        if self.multi_objective_aggregation not in AGGREGATIONS:
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} is invalid: use "
                f"{' or '.join(AGGREGATIONS)}."
            )
        if self.multi_objective_aggregation == "normalize_then_sum" and self.missing_eos_penalty is not None:
            raise ValueError(
                f"missing_eos_penalty={self.missing_eos_penalty} cannot be combined with "
                "multi_objective_aggregation='normalize_then_sum', which normalises each reward function's scores "
                "on their own: add the penalty as a reward function instead, or use 'sum_then_normalize'."
            )

    least_samples_per_prompt: ClassVar = (2, "GRPO", "group-relative advantages need")


class GRPO(PolicyGradient):
    """Group-relative advantages and TRL's GRPO loss, holding its policy loss and token selection (whose entropy
    coefficient is its state).

    Args:
        args, processes, eos_token_id, policy: as ``PolicyGradient``'s.
        reward_weights: [num_rewards] the reward functions' weights (``normalize_then_sum`` weighs normalised scores).

    Example::

        GRPO(GRPOConfig(output_dir="out"), Processes(accelerator), tokenizer.eos_token_id, model, torch.ones(1))
    """

    def __init__(self, args: GRPOConfig, processes: Processes, eos_token_id: int | None, policy, reward_weights):
        super().__init__(args, processes, eos_token_id, policy)
        self.reward_weights = reward_weights
        self.token_selection = TokenSelection(args, processes)
        self.state = self.token_selection.state
        self.reads_engine_logprobs = self.token_selection.reads_engine_logprobs

    def advantages(self, rollout: Rollout) -> Advantages:
        args, k, total = self.args, self.args.n_samples_per_prompt, self.processes.sum
        ones = torch.ones_like(rollout.scores)
        if args.multi_objective_aggregation == "normalize_then_sum":
            rewards = group_normalized_total(rollout.reward_scores, self.reward_weights, k)  # [N]
            moments = masked_moments(rewards, ones, total)  # over every process's rewards
            advantages = whiten(rewards, moments, eps=1e-4)
        else:
            rewards = rollout.scores  # [N]
            batch_std = masked_moments(rewards, ones, total)[1].sqrt() if args.scale_rewards == "batch" else None
            advantages = group_relative_advantages(rewards, k, args.scale_rewards, batch_std)
        metrics = {"frac_reward_zero_std": zero_std_groups(rewards, k).float().mean().item()}
        return self.with_step_tokens(rollout, advantages, metrics)

    def begin_step(self, global_step: int) -> None:
        self.token_selection.begin_step()

    def loss(self, model, batch: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        mask = self.loss_mask(batch)  # [B, C]
        logprobs, entropy, outputs = self.policy_loss.logprobs(model, batch)
        kl = None if batch.ref_logprobs is None else kl_penalty(logprobs, batch.ref_logprobs, "k3")  # [B, C]
        keep, selected = self.token_selection.selected_tokens(logprobs, entropy, batch, mask)  # masking
        loss, metrics = self.policy_loss(logprobs, batch, mask, kl, keep)
        loss, bonus_metrics = self.token_selection.with_entropy_bonus(model.training, loss, entropy, selected)
        loss, aux_metrics = self.policy_loss.with_aux_loss(loss, outputs)  # a Mixture-of-Experts model's balancing
        if kl is not None:
            metrics["kl"] = masked_mean(kl.detach(), mask).item()
        return loss, {**metrics, **bonus_metrics, **aux_metrics, "entropy": masked_mean(entropy.detach(), mask).item()}

    def end_step(self, refused: dict[str, str]) -> dict[str, float]:
        return self.token_selection.end_step(refused)


class GRPOTrainer(OnPolicyTrainer):
    """GRPO on the shared on-policy loop; arguments as ``OnPolicyTrainer``'s.

    Example::

        trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=GRPOConfig(output_dir="out"),
                              train_dataset=load_dataset("trl-lib/DeepMath-103K", split="train"),
                              reward_funcs=[accuracy_reward])
        trainer.train(resume_from_checkpoint=True)
        trainer.save_model("out/actor")
    """

    algorithm_name = "grpo"
    config_class = GRPOConfig
    algorithm_class = GRPO

    def algorithm_inputs(self) -> tuple:
        return self.model, self.reward_weights

    @property
    def entropy_coef(self) -> float:
        """TRL's attribute: the entropy bonus's coefficient now (``use_adaptive_entropy`` moves it each step)."""
        return self.algorithm.token_selection.state.coef
