"""Online DPO (Guo et al., 2024): DPO on pairs the current policy samples, labelled by a judge as they are made.

Shapes: P prompts x 2 samples = N sequences. After labelling, row 2i is pair i's chosen completion and row
2i+1 its rejected one; mini-batches keep pairs whole, so a micro-batch of B rows holds B/2 pairs.

Per pair, with sequence log-probs (summed over completion tokens) of the policy and the frozen reference::

    logits = (log pi(y_w) - log pi(y_l)) - (log ref(y_w) - log ref(y_l))
    sigmoid (DPO):  loss = -log sigmoid(beta * logits)
    ipo:            loss = (logits - 1 / (2 * beta))^2

Log-probs are the policy's own (temperature 1), as in TRL: ``temperature`` shapes sampling only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import PreTrainedModel, TrainingArguments

from ..checkpoint.fingerprint import judge_identity
from ..judges import call_judge, check_judge
from ..ops import (
    chosen_first_order,
    completion_logprobs,
    dpo_logits,
    masked_mean,
    pair_logps,
    pair_ties,
    pair_weights,
    preference_loss,
)
from ..rewards import RewardInputs
from ..rollout import Advantages, Rollout
from .config.batch_hierarchy import check_positive_int
from .config.field_groups import inherited_field
from .config.on_policy_config import DEFAULT_MAX_COMPLETION_LENGTH, DEFAULT_MAX_PROMPT_LENGTH, OnPolicyConfig
from .config.trl_calls import refuse_unused
from .config.trl_names import MAX_NEW_TOKENS, SYNONYMS, resolve_max_prompt_length, views_of
from .loop.algorithm import Algorithm, Processes
from .loop.on_policy import OnPolicyTrainer
from .loop.rollout_rewards import RolloutRewards

LOSS_TYPES = ("sigmoid", "ipo")
TIE_RULES = ("skip", "first")


@views_of(MAX_NEW_TOKENS)
@dataclass
class OnlineDPOConfig(OnPolicyConfig):
    """``OnPolicyConfig`` plus online DPO's options. Two completions per prompt; steadyrl's batch sizes count
    completions, so ``train_batch_size`` and ``micro_train_batch_size`` are even (whole pairs).

    TRL's names count as in TRL's online DPO: ``per_device_train_batch_size`` counts prompts (micro_train_batch_size =
    2 x per_device_train_batch_size) and, unless a rollout size is given, each optimizer step generates its own
    pairs (rollout_batch_size = per_device_train_batch_size x processes x gradient_accumulation_steps prompts).
    ``max_new_tokens`` is ``max_completion_length``, and ``max_length`` (prompt + completion) sets
    max_prompt_length = max_length - max_completion_length. Each field's ``help`` describes it
    (docs/configuration.md lists them); ``disable_dropout`` is True by default here, as in TRL's online DPO.

    Example::

        OnlineDPOConfig(output_dir="out", rollout_batch_size=64, train_batch_size=32, micro_train_batch_size=8,
                        beta=[0.1, 0.05], loss_type="sigmoid", learning_rate=5e-7)
    """

    settings_group: ClassVar[str] = "Online DPO"
    _default_samples_per_prompt = 2
    _completions_per_item = 2  # TRL's per_device_train_batch_size counts prompts, each with a pair of completions
    synonyms = (*SYNONYMS, MAX_NEW_TOKENS)

    n_samples_per_prompt: int | None = field(
        default=None, metadata={"help": "Completions per prompt: must be 2 (a pair)."}
    )
    beta: list[float] = field(
        default_factory=lambda: [0.1],
        metadata={
            "help": "Strength of the pull towards the reference (IPO: its tau). A float, or one value per epoch "
            "over the dataset; the last value holds for the remaining epochs."
        },
    )
    loss_type: str = field(default="sigmoid", metadata={"help": "'sigmoid' (DPO) or 'ipo'."})
    vllm_gpu_memory_utilization: float = field(
        default=0.55,
        metadata={"help": "Colocated: share of GPU memory vLLM may take, in (0, 1]; 0.55 here, as TRL's online DPO."},
    )
    tie_rule: str = field(
        default="skip",
        metadata={
            "help": "Pairs whose two completions score the same: 'skip' leaves them out of the loss (weight 0); "
            "'first' makes the first sampled completion the chosen one, as TRL does."
        },
    )
    reward_model_path: str | None = field(
        default=None, metadata={"help": "Path or Hub id of the reward model, when the trainer is given none."}
    )
    max_new_tokens: int | None = field(default=None, metadata={"help": "TRL's name of max_completion_length."})
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name: prompt + completion tokens; sets max_prompt_length = max_length - "
            "max_completion_length."
        },
    )
    disable_dropout: bool = inherited_field(OnPolicyConfig, "disable_dropout", True)

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r} is invalid: use one of {', '.join(LOSS_TYPES)}.")
        if self.tie_rule not in TIE_RULES:
            raise ValueError(f"tie_rule={self.tie_rule!r} is invalid: use one of {', '.join(TIE_RULES)}.")
        if self.reward_model_path is not None and not isinstance(self.reward_model_path, str):
            raise ValueError(f"reward_model_path={self.reward_model_path!r} is invalid: give a path, a Hub id or None.")

    def _check_samples_per_prompt(self, name: str) -> None:
        if self.n_samples_per_prompt != 2:
            raise ValueError(
                f"{name}={self.n_samples_per_prompt} is invalid for online DPO: it compares exactly 2 completions "
                f"per prompt. Use {name}=2."
            )

    def _resolve_lengths(self, names: dict[str, str]) -> None:
        completion_name = names["max_completion_length"]  # max_new_tokens when given under TRL's name
        check_positive_int(completion_name, self.max_completion_length)
        check_positive_int("max_length", self.max_length)
        if self.max_completion_length is None:
            self.max_completion_length = DEFAULT_MAX_COMPLETION_LENGTH
        self._prompt_length_given = self.max_prompt_length is not None or self.max_length is not None
        self.max_prompt_length = resolve_max_prompt_length(
            self.max_prompt_length,
            self.max_length,
            self.max_completion_length,
            completion_name,
            DEFAULT_MAX_PROMPT_LENGTH,
        )
        self.max_length = self.max_prompt_length + self.max_completion_length

    def _check_micro_batch(self, micro_train_batch_size: int) -> None:
        if micro_train_batch_size % 2:
            raise ValueError(
                f"micro_train_batch_size={micro_train_batch_size} is odd: online DPO trains on whole "
                "(chosen, rejected) pairs, so it must be even."
            )

    def _check_beta(self) -> None:
        values = self.beta if isinstance(self.beta, (list, tuple)) else [self.beta]
        valid = bool(values) and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in values)
        if not valid or not all(b > 0 for b in values):
            raise ValueError(
                f"beta={self.beta!r} is invalid: online DPO needs beta > 0 (a float, or a list with one float > 0 "
                "per epoch)."
            )
        self.beta = float(values[0]) if len(values) == 1 else [float(b) for b in values]


class OnlineDPO(Algorithm):
    """Online DPO's pair order (chosen first, ``tie_rule``'s weights) and its preference loss against the reference.

    Args:
        args, processes, eos_token_id: as ``Algorithm``'s.
        sampler: the prompt sampler (a per-epoch ``beta`` follows the epoch of the rollout's first prompt).

    Example::

        OnlineDPO(OnlineDPOConfig(output_dir="out"), Processes(accelerator), tokenizer.eos_token_id, sampler)
    """

    samples_per_group = 2

    def __init__(self, args: OnlineDPOConfig, processes: Processes, eos_token_id: int | None, sampler) -> None:
        super().__init__(args, processes, eos_token_id)
        self.sampler = sampler

    @classmethod
    def needs_reference(cls, args: OnlineDPOConfig) -> bool:
        return True  # the DPO logits are relative to the reference

    @property
    def logprob_temperature(self) -> float:
        return 1.0

    def needs_old_logprobs(self) -> bool:
        return False  # the loss compares the policy with the reference only

    @property
    def beta(self) -> float:
        """The current rollout's beta: ``args.beta``, or its entry for the epoch of the rollout's first prompt."""
        if not isinstance(self.args.beta, list):
            return self.args.beta
        epoch = max(0, self.sampler.consumed - self.args.rollout_batch_size) // self.sampler.num_prompts
        return self.args.beta[min(epoch, len(self.args.beta) - 1)]

    def advantages(self, rollout: Rollout) -> Advantages:
        """No advantages: each pair is put in (chosen, rejected) order and weighted by ``tie_rule``."""
        order = chosen_first_order(rollout.scores)  # [N]
        ties = pair_ties(rollout.scores)  # [P]
        ordered = rollout.scores[order].view(-1, 2)  # [P, 2]
        metrics = {"scores_margin": (ordered[:, 0] - ordered[:, 1]).mean().item(), "ties": ties.float().mean().item()}
        return Advantages(order=order, pair_weight=pair_weights(ties, self.args.tie_rule), metrics=metrics)

    def loss(self, model, batch: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        mask, beta = batch.completion_mask, self.beta  # [B, C]
        logprobs, _ = completion_logprobs(
            model,
            *batch.token_tensors,
            temperature=self.logprob_temperature,
            packing=self.args.packing,
            images=batch.images,
        )
        policy = pair_logps(logprobs, mask)  # [B/2, 2]: (chosen, rejected) sequence log-probs
        reference = pair_logps(batch.ref_logprobs, mask)
        weight = batch.pair_weight[0::2]  # [B/2]
        loss = (preference_loss(dpo_logits(policy, reference), beta, self.args.loss_type) * weight).mean()
        with torch.no_grad():
            rewards = beta * (policy - reference)  # [B/2, 2] implicit rewards
            margin = rewards[:, 0] - rewards[:, 1]
            metrics = {
                "kl": ((logprobs - batch.ref_logprobs) * mask).sum(1).mean().item(),
                "rewards/chosen": masked_mean(rewards[:, 0], weight).item(),
                "rewards/rejected": masked_mean(rewards[:, 1], weight).item(),
                "rewards/margins": masked_mean(margin, weight).item(),
                "rewards/accuracies": masked_mean((margin > 0).float(), weight).item(),
                "logps/chosen": masked_mean(policy[:, 0], weight).item(),
                "logps/rejected": masked_mean(policy[:, 1], weight).item(),
                "beta": beta,
            }
        return loss, metrics


class OnlineDPOTrainer(OnPolicyTrainer):
    """Online DPO on the shared on-policy loop: the policy samples two completions per prompt, a judge picks the
    chosen one, and a DPO step is taken on the pair against the frozen reference.

    Args:
        judge: a pairwise judge, ``judge(prompts, completion_pairs) -> list[int]`` (a callable or an object with
            a ``judge`` method), answering 0 or 1 per pair. Without it the completion with the higher weighted
            total of ``reward_funcs`` (and ``reward_model``) wins, less ``missing_eos_penalty`` for a completion
            without EOS. With a judge, ``missing_eos_penalty`` (any value) makes a completion without EOS lose to one
            with EOS before the judge's answer counts; ties follow ``tie_rule``.
        The other arguments are ``OnPolicyTrainer``'s.

    Example::

        trainer = OnlineDPOTrainer(model="my/sft-model", args=OnlineDPOConfig(output_dir="out"),
                                   train_dataset=prompts, reward_model="my/reward-model")
        trainer.train(resume_from_checkpoint=True)
    """

    algorithm_name = "online-dpo"
    config_class = OnlineDPOConfig

    algorithm_class = OnlineDPO

    def __init__(
        self,
        model: str | PreTrainedModel,
        ref_model: str | PreTrainedModel | None = None,
        reward_funcs=None,
        args: OnlineDPOConfig | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        peft_config=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        preprocess_logits_for_metrics=None,
        *,
        reward_model: str | PreTrainedModel | None = None,
        reward_processing_class=None,
        judge=None,
    ):
        if isinstance(ref_model, TrainingArguments):
            raise TypeError(
                "OnlineDPOTrainer takes TRL's order (model, ref_model, reward_funcs, args, data_collator, "
                "train_dataset, ...), and a config came where ref_model belongs: pass the arguments after model by "
                "keyword (args=..., train_dataset=...)."
            )
        refuse_unused(
            "OnlineDPOTrainer",
            data_collator=data_collator,
            compute_metrics=compute_metrics,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )
        if judge is not None:
            check_judge(judge)
            if eval_dataset is not None:
                raise ValueError(
                    "eval_dataset with a judge is not supported: evaluation scores completions with reward_funcs or "
                    "reward_model, and a pairwise judge gives no score. Pass reward_funcs / reward_model, or no "
                    "eval_dataset."
                )
        if (
            isinstance(getattr(args, "beta", None), list)
            and train_dataset is not None
            and not hasattr(train_dataset, "__len__")
        ):
            raise ValueError(
                f"beta={args.beta} (one value per epoch) needs a train_dataset whose length is known, and a "
                f"streaming {type(train_dataset).__name__} has none: give one beta, or a map-style datasets.Dataset."
            )
        self.judge = judge
        path = getattr(args, "reward_model_path", None)
        if path is not None and reward_model is not None:
            raise ValueError(
                f"reward_model and args.reward_model_path={path!r} were both given: pass the reward model one way."
            )
        reward_model = path if reward_model is None else reward_model
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
            None,
            peft_config,
            reward_model=reward_model,
            reward_processing_class=reward_processing_class,
            ref_model=ref_model,
        )
        self.identity.update(judge_identity(judge))

    def algorithm_inputs(self) -> tuple:
        return (self.sampler,)

    @property
    def beta(self) -> float:
        """TRL's attribute: the current rollout's beta."""
        return self.algorithm.beta

    # ---- who wins each pair ----------------------------------------------------------------------

    def checked_rewards(self, reward_funcs: list, args, dataset) -> tuple[list, torch.Tensor]:
        if self.judge is None:
            return super().checked_rewards(reward_funcs, args, dataset)
        if reward_funcs or args.reward_weights is not None:
            raise ValueError(
                "Both judge and reward_funcs/reward_model/reward_weights were given: online DPO ranks each pair "
                "with one of them. Pass either judge, or reward_funcs and/or reward_model."
            )
        return [], torch.ones(1)

    def make_rewards(self) -> RolloutRewards:
        return super().make_rewards() if self.judge is None else JudgeRewards(self.judge, self.args)


class JudgeRewards(RolloutRewards):
    """A pairwise judge's verdicts as scores: 1 for the preferred completion of each pair, 0 for the other."""

    def __init__(self, judge, args: OnlineDPOConfig) -> None:
        super().__init__([], torch.ones(1), args)
        self.judge = judge

    def score(self, inputs: RewardInputs, state) -> torch.Tensor:
        texts = inputs.completion_texts  # a judge reads text: the prompt as rendered for the policy, the completions
        pairs = [list(pair) for pair in zip(texts[0::2], texts[1::2])]
        preferred = call_judge(self.judge, inputs.prompt_texts[0::2], pairs)
        scores = torch.zeros(len(texts), 1)
        scores[[2 * i + p for i, p in enumerate(preferred)]] = 1.0
        return scores

    def penalise_missing_eos(self, total: torch.Tensor, no_eos: torch.Tensor) -> torch.Tensor:
        """A completion without EOS loses to one with EOS whatever the judge said, and the judge decides between two
        with EOS or two without: a penalty of 2 orders the 0/1 scores so, whatever ``missing_eos_penalty``'s value
        (subtracting it from 0/1 scores would turn preferences into ties)."""
        return total - 2.0 * no_eos.float()
