"""Pure tensor math: log-probs, advantages (RLOO, GAE, PPO reward shaping, KL control, DPO pairs) and losses."""

from .advantages import (
    RunningMoments,
    adaptive_kl_coef,
    chosen_first_order,
    generalized_advantage_estimation,
    leave_one_out_advantages,
    pair_ties,
    pair_weights,
    shaped_token_rewards,
    whiten,
)
from .logprobs import (
    batched_forward,
    batched_logprobs,
    completion_logprobs,
    ends_without_eos,
    joined_inputs,
    kl_penalty,
    last_token_index,
    pad_prompts_and_completions,
    sequence_kl,
)
from .losses import clipped_policy_loss, clipped_value_loss, dpo_logits, pair_logps, preference_loss
from .masked import masked_mean, masked_var, masked_whiten

__all__ = [
    "RunningMoments",
    "adaptive_kl_coef",
    "batched_forward",
    "batched_logprobs",
    "chosen_first_order",
    "clipped_policy_loss",
    "clipped_value_loss",
    "completion_logprobs",
    "dpo_logits",
    "ends_without_eos",
    "generalized_advantage_estimation",
    "joined_inputs",
    "kl_penalty",
    "last_token_index",
    "leave_one_out_advantages",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "pad_prompts_and_completions",
    "pair_logps",
    "pair_ties",
    "pair_weights",
    "preference_loss",
    "sequence_kl",
    "shaped_token_rewards",
    "whiten",
]
