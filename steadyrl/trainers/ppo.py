"""PPO with a learned critic (Schulman et al., 2017; Ouyang et al., 2022), as in OpenRLHF and TRL's PPOv2.

Shapes: N sequences in a rollout, B in a micro-batch, C completion tokens.

Per-token reward: r_t = -kl_coef * KL_t, plus the sequence score at the last completion token.
Advantages: GAE(gamma, lam) over r_t and the critic's values V_t, whitened over the rollout.
Loss: clipped policy surrogate + vf_coef * clipped value loss; actor and critic have their own
optimizer and LR scheduler, both in the checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, get_scheduler

from ..ops import (
    clipped_policy_loss,
    clipped_value_loss,
    completion_logprobs,
    generalized_advantage_estimation,
    kl_penalty,
    last_token_index,
    masked_mean,
    masked_var,
    masked_whiten,
)
from ..scalar_head import Critic, check_same_vocabulary, critic_from_policy, load_scalar_model
from .config import OnPolicyConfig
from .on_policy import OnPolicyTrainer, enable_gradient_checkpointing


@dataclass
class PPOConfig(OnPolicyConfig):
    """OnPolicyConfig plus PPO's critic, GAE, KL-control and reward-processing options."""

    gamma: float = field(default=1.0, metadata={"help": "Discount factor, in (0, 1]."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda, in (0, 1]."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clipping range of the value update."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss."})
    kl_estimator: str = field(default="k1", metadata={"help": "Per-token KL estimator in the reward: k1 or k3."})
    target_kl: float | None = field(
        default=None, metadata={"help": "Adaptive KL control (Ziegler et al.): steer kl_coef towards this KL."}
    )
    kl_horizon: int = field(default=10000, metadata={"help": "Horizon (in samples) of adaptive KL control."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Whiten advantages over each rollout."})
    normalize_reward: bool = field(
        default=False, metadata={"help": "Normalise scores by their running mean and std over the whole run."}
    )
    reward_clip_range: float | None = field(
        default=None, metadata={"help": "Clip (normalised) scores to [-reward_clip_range, reward_clip_range]."}
    )
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the critic; learning_rate if unset."}
    )
    critic_warmup_steps: int = field(
        default=0, metadata={"help": "First global steps in which only the critic learns (the actor is frozen)."}
    )

    def __post_init__(self):
        super().__post_init__()
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name}={value} is invalid: it must be in (0, 1] (1.0 is usual for gamma).")
        positive = {"cliprange_value": self.cliprange_value, "vf_coef": self.vf_coef, "kl_horizon": self.kl_horizon}
        optional = {"target_kl": self.target_kl, "reward_clip_range": self.reward_clip_range}
        optional["critic_learning_rate"] = self.critic_learning_rate
        for name, value in {**positive, **{k: v for k, v in optional.items() if v is not None}}.items():
            if not value > 0:
                raise ValueError(f"{name}={value} is invalid: it must be > 0.")
        if self.kl_estimator not in ("k1", "k3"):
            raise ValueError(f"kl_estimator={self.kl_estimator!r} is invalid: use 'k1' or 'k3'.")
        if self.critic_warmup_steps < 0:
            raise ValueError(f"critic_warmup_steps={self.critic_warmup_steps} is invalid: it must be >= 0.")


class RunningMoments:
    """Mean and variance of every score seen so far (Chan et al.'s parallel update), for ``normalize_reward``."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 0

    def update(self, values: torch.Tensor) -> None:
        n, mean, var = values.numel(), values.double().mean().item(), values.double().var(unbiased=False).item()
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta**2 * self.count * n / total
        self.mean, self.var, self.count = self.mean + delta * n / total, m2 / total, total

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


class PPOTrainer(OnPolicyTrainer):
    """``PPOTrainer(model, args=PPOConfig(...), train_dataset, processing_class, reward_funcs and/or reward_model,
    value_model=None, ...)``.

    The critic is ``value_model`` if given; else, as in OpenRLHF, a copy of ``reward_model`` (its backbone and
    score head); else the policy's backbone with a freshly initialised value head.
    """

    algorithm_name = "ppo"
    config_class = PPOConfig

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: PPOConfig | None = None,
        train_dataset=None,
        processing_class=None,
        reward_funcs=None,
        callbacks=None,
        peft_config=None,
        optimizers=(None, None),
        reward_model: str | PreTrainedModel | None = None,
        reward_processing_class=None,
        value_model: str | PreTrainedModel | None = None,
    ):
        super().__init__(
            model, args, train_dataset, processing_class, reward_funcs, callbacks, peft_config, optimizers,
            reward_model=reward_model, reward_processing_class=reward_processing_class,
        )  # fmt: skip
        actor = self.accelerator.unwrap_model(self.model)
        if value_model is not None:
            critic = load_scalar_model(value_model, "value_model")
            check_same_vocabulary(critic, "value_model", actor, self.processing_class)
        elif self.reward_model is not None:
            critic = copy.deepcopy(self.reward_model)
        else:
            critic = critic_from_policy(actor, self.args.seed)
        self.critic = Critic(critic.train().requires_grad_(True)).to(self.accelerator.device)
        self.kl_coef = self.args.beta
        self.score_moments = RunningMoments()

    # ---- models, optimizers, checkpoint state ---------------------------------------------------

    def prepare_for_training(self, max_steps: int) -> None:
        super().prepare_for_training(max_steps)
        args = self.args
        self.critic_optimizer = torch.optim.AdamW(
            self.critic.parameters(),
            lr=args.critic_learning_rate or args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            weight_decay=args.weight_decay,
        )
        self.critic_scheduler = get_scheduler(
            args.lr_scheduler_type,
            self.critic_optimizer,
            num_warmup_steps=args.get_warmup_steps(max_steps),
            num_training_steps=max_steps,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs,
        )
        if args.gradient_checkpointing:
            enable_gradient_checkpointing(self.critic.model, args)
        self.critic_wrapped, self.critic_optimizer = self.accelerator.prepare(self.critic, self.critic_optimizer)

    def trained_modules(self):
        return [
            *super().trained_modules(),
            ("critic", self.critic_wrapped, self.critic_optimizer, self.critic_scheduler),
        ]

    def run_fingerprint(self) -> dict:
        config = self.critic.config.get_text_config()
        return {
            **super().run_fingerprint(),
            "critic": [config.model_type, config.hidden_size, config.num_hidden_layers],
        }

    def algorithm_state(self) -> dict:
        return {"kl_coef": self.kl_coef, "score_moments": self.score_moments.state_dict()}

    def load_algorithm_state(self, state: dict) -> None:
        self.kl_coef = state["kl_coef"]
        self.score_moments.load_state_dict(state["score_moments"])

    # ---- experience -> advantages ---------------------------------------------------------------

    def process_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Running normalisation and clipping of the sequence scores [N], as configured."""
        args = self.args
        if args.normalize_reward:
            self.score_moments.update(self.accelerator.gather(scores))
            scores = (scores - self.score_moments.mean) / (self.score_moments.var**0.5 + 1e-8)
        if args.reward_clip_range is not None:
            scores = scores.clamp(-args.reward_clip_range, args.reward_clip_range)
        return scores

    def compute_advantages(self, experience: dict[str, torch.Tensor]) -> dict[str, float]:
        args, mask = self.args, experience["completion_mask"].float()  # [N, C]
        values = self.micro_batched(self.critic, lambda critic, *tensors: critic(*tensors), experience)  # [N, C]
        scores = self.process_scores(experience["scores"])  # [N]
        kl = kl_penalty(experience["old_logprobs"], experience["ref_logprobs"], args.kl_estimator) * mask
        non_score_rewards = -self.kl_coef * kl  # [N, C]
        rows = torch.arange(len(scores), device=scores.device)
        rewards = non_score_rewards.clone()
        rewards[rows, last_token_index(mask)] += scores
        advantages, returns = generalized_advantage_estimation(rewards, values, mask, args.gamma, args.lam)
        metrics = {
            "score": scores.mean().item(),
            "non_score_reward": non_score_rewards.sum(1).mean().item(),
            "rlhf_reward": rewards.sum(1).mean().item(),
            "kl_coef": self.kl_coef,
            "advantages_mean": masked_mean(advantages, mask).item(),
            "advantages_std": masked_var(advantages, mask).sqrt().item(),
            "value_mean": masked_mean(values, mask).item(),
            "explained_variance": 1 - (masked_var(returns - values, mask) / masked_var(returns, mask)).item(),
        }
        if args.whiten_advantages:
            advantages = masked_whiten(advantages, mask)
        experience.update(values=values, returns=returns, advantages=advantages)
        self.update_kl_coef(kl.sum(1))
        return metrics

    def update_kl_coef(self, kl: torch.Tensor) -> None:
        """Adaptive KL control: move kl_coef by at most 20% x (samples / horizon) towards ``target_kl``."""
        if self.args.target_kl is None:
            return
        kl = self.accelerator.gather(kl)
        error = min(max(kl.mean().item() / self.args.target_kl - 1, -0.2), 0.2)
        self.kl_coef *= 1 + error * len(kl) / self.args.kl_horizon

    # ---- loss -------------------------------------------------------------------------------------

    def compute_loss_on_batch(self, model, batch: dict[str, torch.Tensor]):
        args, mask = self.args, batch["completion_mask"]  # [B, C]
        tensors = (batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], mask)
        actor_frozen = self.state.global_step < args.critic_warmup_steps
        with torch.no_grad() if actor_frozen else contextlib.nullcontext():
            logprobs, entropy = completion_logprobs(model, *tensors, temperature=args.temperature, with_entropy=True)
            policy_loss, policy_metrics = clipped_policy_loss(
                logprobs, batch["old_logprobs"], batch["advantages"], mask, args.cliprange
            )
        values = self.critic_wrapped(*tensors)  # [B, C]
        value_loss, value_metrics = clipped_value_loss(
            values, batch["values"], batch["returns"], mask, args.cliprange_value
        )
        losses = {"critic": args.vf_coef * value_loss}  # one loss per trained module: their parameters are disjoint
        if not actor_frozen:
            losses["actor"] = policy_loss
        metrics = {
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": masked_mean(entropy, mask).item(),
            **policy_metrics,
            **value_metrics,
        }
        return losses, metrics
