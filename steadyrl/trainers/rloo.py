"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al., 2024), with PPO-style ratio clipping.

Shapes: P prompts x k samples = N sequences, C completion tokens.

    reward_i = score_i - beta * KL_i                       KL_i: summed over the tokens of sequence i
    A_i = reward_i - mean of the other k - 1 rewards of its prompt
    loss = loss_type's (ops.POLICY_LOSSES): the clipped surrogate of A_i at every completion token, token mean over
           the micro-batch (bnpo, the default), or TRL's RLOO loss, one clipped ratio per sequence (rloo), ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..ops import leave_one_out_advantages, masked_mean, masked_moments, sequence_kl, whiten
from ..rollout import Advantages, Rollout
from .config.dynamic_sampling import DynamicSamplingOptions
from .config.on_policy_config import OnPolicyConfig
from .config.policy_loss import PolicyLossOptions, loss_type_help
from .loop.on_policy import OnPolicyTrainer
from .loop.policy_loss import PolicyGradient


@dataclass
class RLOOConfig(PolicyLossOptions, DynamicSamplingOptions, OnPolicyConfig):
    """``OnPolicyConfig`` plus RLOO's options; ``n_samples_per_prompt`` (k, TRL: ``num_generations``) must be at
    least 2. The KL penalty (``beta``) is part of the reward, as in TRL's RLOO. Each field's ``help`` describes it
    (docs/configuration.md lists them).

    Example::

        RLOOConfig(output_dir="out", rollout_batch_size=64, n_samples_per_prompt=4, train_batch_size=64,
                   micro_train_batch_size=8, beta=0.05, learning_rate=1e-6, save_steps=100)
    """

    settings_group: ClassVar[str] = "RLOO"
    extra_loss_types: ClassVar[tuple[str, ...]] = ("rloo",)

    loss_type: str = field(default="bnpo", metadata={"help": loss_type_help(extra_loss_types)})
    normalize_advantages: bool = field(default=False, metadata={"help": "Whiten advantages over the rollout."})
    reward_clip_range: list[float] | None = field(
        default=None,
        metadata={
            "help": "(min, max): clip each score to this range before the KL penalty; None: no clipping (as "
            "TRL's RLOO; PPO's reward_clip_range is one bound, [-x, x])."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self._check_policy_loss()
        bounds = self.reward_clip_range
        if bounds is not None:
            numbers = isinstance(bounds, (list, tuple)) and len(bounds) == 2
            numbers = numbers and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
            if not (numbers and math.isfinite(bounds[0]) and math.isfinite(bounds[1]) and bounds[0] < bounds[1]):
                raise ValueError(
                    f"reward_clip_range={bounds!r} is invalid: give (min, max), two finite numbers with min < max "
                    "(None: no clipping)."
                )
            self.reward_clip_range = (float(bounds[0]), float(bounds[1]))

    least_samples_per_prompt: ClassVar = (2, "RLOO", "the leave-one-out baseline needs")


class RLOO(PolicyGradient):
    """RLOO's advantages (the KL penalty in the reward, a leave-one-out baseline) and the ``loss_type`` family's
    loss. Built by ``RLOOTrainer``.

    Example::

        RLOO(RLOOConfig(output_dir="out"), Processes(accelerator), tokenizer.eos_token_id, model)
    """

    def needs_old_logprobs(self) -> bool:
        return super().needs_old_logprobs() or self.args.beta > 0  # the KL penalty is part of the reward

    def advantages(self, rollout: Rollout) -> Advantages:
        if rollout.ref_logprobs is None or rollout.old_logprobs is None:  # beta is 0: no KL penalty to compute
            kl = torch.zeros_like(rollout.scores)
        else:
            kl = sequence_kl(rollout.old_logprobs, rollout.ref_logprobs, rollout.policy_mask)  # [N]
        scores, clip = rollout.scores, self.args.reward_clip_range  # [N]; clip: TRL's (min, max) or None
        if clip is not None:
            scores = scores.clamp(*clip)
        rewards = scores - self.args.beta * kl  # [N]
        advantages = leave_one_out_advantages(rewards, self.args.n_samples_per_prompt)  # [N]
        if self.args.normalize_advantages:  # over the whole rollout: every process's share
            total = self.processes.sum
            moments = None if total is None else masked_moments(advantages, torch.ones_like(advantages), total)
            advantages = whiten(advantages, moments)
        metrics = {"rlhf_reward": rewards.mean().item(), "advantages_std": advantages.std().item()}
        return self.with_step_tokens(rollout, advantages, metrics)

    def loss(self, model, batch: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        mask = self.loss_mask(batch)  # [B, C]
        logprobs, entropy, outputs = self.policy_loss.logprobs(model, batch)
        extra = {}
        if batch.old_logprobs is None and batch.ref_logprobs is not None:  # the KL the rollout could not compute
            extra["kl"] = sequence_kl(logprobs.detach(), batch.ref_logprobs, batch.policy_mask).mean().item()
        loss, metrics = self.policy_loss(logprobs, batch, mask)  # loss_type's, from ops.POLICY_LOSSES
        loss, aux_metrics = self.policy_loss.with_aux_loss(loss, outputs)  # a Mixture-of-Experts model's load balancing
        return loss, {**metrics, **aux_metrics, "entropy": masked_mean(entropy.detach(), mask).item(), **extra}


class RLOOTrainer(OnPolicyTrainer):
    """RLOO on the shared on-policy loop; arguments as ``OnPolicyTrainer``'s.

    Example::

        trainer = RLOOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=RLOOConfig(output_dir="out"),
                              train_dataset=load_dataset("my/prompts", split="train"), reward_funcs=[my_reward])
        trainer.train(resume_from_checkpoint=True)
        trainer.save_model("out/actor")
    """

    algorithm_name = "rloo"
    config_class = RLOOConfig
    algorithm_class = RLOO

    def algorithm_inputs(self) -> tuple:
        return (self.model,)
