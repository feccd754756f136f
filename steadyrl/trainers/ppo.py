"""PPO with a learned critic (Schulman et al., 2017; Ouyang et al., 2022), as in OpenRLHF and TRL's PPOv2.

Shapes: N sequences in a rollout, B in a micro-batch, C completion tokens.

Per-token reward: r_t = -kl_coef * KL_t, plus the sequence score at the last completion token.
Advantages: GAE(gamma, lam) over r_t and the critic's values V_t, whitened over the rollout.
Loss: clipped policy surrogate + vf_coef * clipped value loss; actor and critic have their own
optimizer and LR scheduler, both in the checkpoint.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import PreTrainedModel, get_scheduler
from transformers.utils import logging

from ..checkpoint.checkpointer import TrainedModule
from ..checkpoint.fingerprint import model_identity
from ..distributed.fsdp import broadcast_at_prepare
from ..models.loading import (
    check_master_weights,
    disable_dropout,
    enable_gradient_checkpointing,
    policy_init_kwargs,
)
from ..models.scalar_head import (
    Critic,
    RewardModelFunction,
    initial_critic,
)
from ..ops import (
    POLICY_LOSSES,
    RunningMoments,
    adaptive_kl_coef,
    batched_forward,
    completion_logprobs,
    generalized_advantage_estimation,
    kl_penalty,
    masked_mean,
    masked_moments,
    masked_var,
    masked_whiten,
    shaped_token_rewards,
)
from ..rollout import Advantages, Rollout
from .config.on_policy_config import OnPolicyConfig
from .config.trl_names import Synonym, views_of
from .loop.algorithm import Algorithm, Processes
from .loop.on_policy import OnPolicyTrainer

logger = logging.get_logger(__name__)


KL_COEF = Synonym("kl_coef", "beta", "the KL coefficient")
RESPONSE_LENGTH = Synonym("response_length", "max_completion_length", "the most tokens generated per completion")


@views_of(KL_COEF, RESPONSE_LENGTH)
@dataclass
class OldPPONames:
    """TRL's old ``PPOConfig`` names: two are views of steadyrl's fields (stored once, under steadyrl's name), two
    are refused with what to use instead."""

    settings_group: ClassVar[str] = "TRL's old PPO names"

    kl_coef: float | None = field(default=None, metadata={"help": "TRL's old PPO name of beta."})
    response_length: int | None = field(default=None, metadata={"help": "TRL's old PPO name of max_completion_length."})
    num_mini_batches: int | None = field(default=None, metadata={"help": "Not supported: set train_batch_size."})
    whiten_rewards: bool | None = field(
        default=None, metadata={"help": "Not supported: see normalize_reward and whiten_advantages."}
    )


@dataclass
class PPOConfig(OldPPONames, OnPolicyConfig):
    """``OnPolicyConfig`` plus PPO's critic, GAE, KL-control and reward-processing options. Each field's ``help``
    describes it (docs/configuration.md lists them).

    Example::

        PPOConfig(output_dir="out", rollout_batch_size=64, n_samples_per_prompt=1, train_batch_size=32,
                  micro_train_batch_size=4, num_ppo_epochs=2, learning_rate=5e-7, critic_learning_rate=9e-6)
    """

    settings_group: ClassVar[str] = "PPO"

    gamma: float = field(default=1.0, metadata={"help": "Discount factor, in (0, 1]."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda, in (0, 1]."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clipping range of the value update."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss."})
    kl_estimator: str = field(default="k1", metadata={"help": "Per-token KL estimator in the reward: k1 or k3."})
    target_kl: float | None = field(
        default=None,
        metadata={
            "help": "Adaptive KL control (Ziegler et al.): steer kl_coef (starting at beta) towards this KL by "
            "a relative change of at most 0.2 x samples / kl_horizon per rollout; None: off."
        },
    )
    kl_horizon: int = field(default=10000, metadata={"help": "Horizon (in samples) of adaptive KL control."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Whiten advantages over each rollout."})
    normalize_reward: bool = field(
        default=False, metadata={"help": "Normalise scores by their running mean and std over the whole run."}
    )
    reward_clip_range: float | None = field(
        default=None,
        metadata={
            "help": "Clip (normalised) scores to [-reward_clip_range, reward_clip_range] (RLOO's, as TRL's, is "
            "a (min, max) pair)."
        },
    )
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the critic; learning_rate if unset."}
    )
    critic_warmup_steps: int = field(
        default=0, metadata={"help": "First global steps in which only the critic learns (the actor is frozen)."}
    )

    def __post_init__(self):
        self._resolve_old_trl_names()
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

    def _resolve_old_trl_names(self) -> None:
        """Before ``OnPolicyConfig.__post_init__`` resolves TRL's current names (and marks the config resolved)."""
        for synonym, default in ((KL_COEF, 0.05), (RESPONSE_LENGTH, None)):
            value, own = synonym.take(self), getattr(self, synonym.own_name)
            if value is None:
                continue
            if own not in (default, value):
                raise ValueError(
                    f"{synonym.trl_name}={value!r} contradicts {synonym.own_name}={own!r}: both set "
                    f"{synonym.meaning} ({synonym.trl_name} is TRL's old PPO name of {synonym.own_name}); give one "
                    "of them."
                )
            setattr(self, synonym.own_name, value)
        if self.num_mini_batches is not None:
            raise ValueError(
                f"num_mini_batches={self.num_mini_batches} is TRL's old PPO setting, not steadyrl's: a rollout's "
                "mini-batches are set by train_batch_size, the samples of one optimizer step (rollout_batch_size x "
                f"n_samples_per_prompt / {self.num_mini_batches} gives {self.num_mini_batches} mini-batches per "
                "rollout). Set train_batch_size instead."
            )
        if self.whiten_rewards is not None:
            raise ValueError(
                f"whiten_rewards={self.whiten_rewards} is TRL's old PPO setting, not steadyrl's: use "
                "normalize_reward=True (scores normalised by their running mean and std) and whiten_advantages "
                "(default True)."
            )


@dataclass
class PPOState:
    """What PPO carries from one rollout to the next: the (adaptive) KL coefficient and the running moments of
    the scores (``normalize_reward``)."""

    kl_coef: float
    score_moments: RunningMoments = field(default_factory=RunningMoments)

    def state_dict(self) -> dict:
        return {"kl_coef": self.kl_coef, "score_moments": self.score_moments.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.kl_coef = state["kl_coef"]
        self.score_moments = RunningMoments.from_state_dict(state["score_moments"])


class PPO(Algorithm):
    """PPO's advantages (GAE over KL-shaped per-token rewards and the critic's values) and its clipped policy and
    value losses (``ops.POLICY_LOSSES``' ``ppo`` and ``ppo_value``, built once), one per trained module; its state is
    the KL coefficient and the score moments.

    Args:
        args, processes, eos_token_id: as ``Algorithm``'s.
        critic: the value model (``Critic``); the loss trains ``critic_engine``, the critic as prepared for training
            (DDP, DeepSpeed), which ``PPOTrainer`` binds once it is made.

    Example::

        PPO(PPOConfig(output_dir="out"), Processes(accelerator), tokenizer.eos_token_id, Critic(value_model))
    """

    takes_images = False  # its critic's value pass takes no images yet

    def __init__(self, args: PPOConfig, processes: Processes, eos_token_id: int | None, critic: Critic) -> None:
        super().__init__(args, processes, eos_token_id)
        self.critic = self.critic_engine = critic
        self.state = PPOState(kl_coef=args.beta)
        self.actor_frozen = False  # during critic_warmup_steps only the critic trains
        self.policy_loss = POLICY_LOSSES["ppo"].from_config(args)  # cliprange, cliprange_high
        self.value_loss = POLICY_LOSSES["ppo_value"].from_config(args)  # cliprange_value

    def needs_old_logprobs(self) -> bool:
        return True  # the per-token KL penalty in the rewards is computed before any training pass

    def begin_step(self, global_step: int) -> None:
        self.actor_frozen = global_step < self.args.critic_warmup_steps

    def advantages(self, rollout: Rollout) -> Advantages:
        args, state, mask = self.args, self.state, rollout.completion_mask.float()  # [N, C]
        values = batched_forward(
            self.critic,
            lambda critic, *tensors: critic(*tensors, packing=args.packing),
            rollout.token_tensors,
            args.micro_rollout_batch_size,
            args.pad_to_multiple_of,
            args.packing,
        )  # [N, C]
        scores = rollout.scores  # [N]
        if args.normalize_reward:  # by the mean and std of every score so far, on every process
            state.score_moments = state.score_moments.updated(self.processes.gather(scores))
            scores = state.score_moments.normalize(scores)
        if args.reward_clip_range is not None:
            scores = scores.clamp(-args.reward_clip_range, args.reward_clip_range)
        if rollout.ref_logprobs is None:  # beta 0: no KL penalty, no reference
            token_kl = torch.zeros_like(mask)
        else:
            token_kl = kl_penalty(rollout.old_logprobs, rollout.ref_logprobs, args.kl_estimator) * mask  # [N, C]
        rewards, non_score_rewards = shaped_token_rewards(scores, token_kl, state.kl_coef, mask)
        advantages, returns = generalized_advantage_estimation(rewards, values, mask, args.gamma, args.lam)
        moments = masked_moments(advantages, mask, self.processes.sum)  # over the whole rollout
        metrics = {
            "score": scores.mean().item(),
            "non_score_reward": non_score_rewards.sum(1).mean().item(),
            "rlhf_reward": rewards.sum(1).mean().item(),
            "kl_coef": state.kl_coef,
            "advantages_mean": moments[0].item(),
            "advantages_std": moments[1].sqrt().item(),
            "value_mean": masked_mean(values, mask).item(),
            "explained_variance": 1 - (masked_var(returns - values, mask) / masked_var(returns, mask)).item(),
        }
        if args.whiten_advantages:
            advantages = masked_whiten(advantages, mask, moments)
        if args.target_kl is not None:
            kl = self.processes.gather(token_kl.sum(1))  # [N x processes]
            state.kl_coef = adaptive_kl_coef(state.kl_coef, kl.mean().item(), args.target_kl, len(kl), args.kl_horizon)
        return Advantages(advantages=advantages, values=values, returns=returns, metrics=metrics)

    def loss(self, model, batch: Rollout):
        args, mask = self.args, self.loss_mask(batch)  # [B, C]
        actor_frozen = self.actor_frozen
        with torch.no_grad() if actor_frozen else contextlib.nullcontext():
            logprobs, entropy = completion_logprobs(
                model, *batch.token_tensors, temperature=args.temperature, with_entropy=True, packing=args.packing
            )
            policy_loss, policy_metrics = self.policy_loss(logprobs, batch.old_logprobs, batch.advantages, mask)
        values = self.critic_engine(*batch.token_tensors, packing=args.packing)  # [B, C]
        value_loss, value_metrics = self.value_loss(values, batch.values, batch.returns, mask)
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


class PPOTrainer(OnPolicyTrainer):
    """PPO with a learned critic on the shared on-policy loop.

    Args:
        value_model: the critic, an ``AutoModelForSequenceClassification`` (``num_labels=1``) or its path, sharing
            the policy's tokenizer. Default: as in OpenRLHF a copy of ``reward_model`` (backbone and score head) if
            one is given, else the policy's backbone with a freshly initialised value head.
        The other arguments are ``OnPolicyTrainer``'s.

    Example::

        trainer = PPOTrainer(model="my/sft-model", args=PPOConfig(output_dir="out"), train_dataset=prompts,
                             reward_model="my/reward-model")
        trainer.train(resume_from_checkpoint=True)
        trainer.save_model("out/actor")  # the actor only; the critic stays in the checkpoints
    """

    algorithm_name = "ppo"
    config_class = PPOConfig
    algorithm_class = PPO

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs=None,
        args: PPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        *,
        value_model: str | PreTrainedModel | None = None,
        reward_model: str | PreTrainedModel | None = None,
        reward_processing_class=None,
        ref_model: str | PreTrainedModel | None = None,
    ):
        """``OnPolicyTrainer``'s arguments, in its order (PPO has no multi-turn rollouts: no ``tools``,
        ``rollout_func`` or ``environment_factory``), and ``value_model``."""
        self._value_model_given = value_model
        super().__init__(
            model,
            reward_funcs,
            args,
            train_dataset,
            eval_dataset,
            processing_class,
            reward_processing_classes,
            callbacks,
            optimizers,
            quantization_config,
            peft_config,
            reward_model=reward_model,
            reward_processing_class=reward_processing_class,
            ref_model=ref_model,
        )

    def add_algorithm_models(self) -> None:
        """The critic: ``value_model``, else a copy of the reward model, else the policy's backbone."""
        reads_policy_tokens = self.reward_model is not None and self.reward_model_reads_policy_tokens()
        given, init_kwargs = self._value_model_given, policy_init_kwargs(self.args)
        critic = initial_critic(
            given, init_kwargs, self.model, self.processing_class, self.reward_model, reads_policy_tokens, self.args
        )
        if self.args.disable_dropout:
            disable_dropout(critic)
        self.critic = Critic(critic.train().requires_grad_(True)).to(self.accelerator.device)
        check_master_weights(self.critic, "the critic", self.args, self.deepspeed_config)
        broadcast_at_prepare(self.accelerator, critic)
        self.identity.update(model_identity("critic", critic))

    def algorithm_inputs(self) -> tuple:
        return (self.critic,)

    def reward_model_reads_policy_tokens(self) -> bool:
        scorer = next(func for func in self.reward_funcs if isinstance(func, RewardModelFunction))
        return scorer.tokenizer is None

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
            enable_gradient_checkpointing(self.critic.model, args.gradient_checkpointing_kwargs)
        self.critic_wrapped, self.critic_optimizer = self.accelerator.prepare(self.critic, self.critic_optimizer)
        self.algorithm.critic_engine = self.critic_wrapped

    def trained_modules(self) -> list[TrainedModule]:
        def save_critic(directory):
            self.save_pretrained_model(self.critic.model, directory)

        critic = TrainedModule(
            "critic", self.critic_wrapped, self.critic_optimizer, self.critic_scheduler, self.critic.model, save_critic
        )
        return [*super().trained_modules(), critic]

    # ---- rollout -> advantages -> loss: the algorithm ---------------------------------------------
