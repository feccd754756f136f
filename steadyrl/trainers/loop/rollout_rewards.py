"""How a rollout is rewarded: ``Scorer`` puts a sampled rollout's completions in TRL's reward inputs, and
``RolloutRewards`` scores them with the reward functions and models, and gives each sample its total. A trainer
whose signal is not a weighted sum of rewards (online DPO's judge, distillation's teacher) builds a subclass in
``make_rewards``."""

from __future__ import annotations

import dataclasses

import torch
from transformers import TrainerState

from ...agents.turns import Trajectories
from ...data.prompts import as_completions, prompt_texts
from ...generation import Generation
from ...rewards import RewardInputs, reward_func_name, score_completions, weighted_total
from .sources import Sampled


class RolloutRewards:
    """The reward functions and models of a run, with their weights.

    Args:
        funcs: the checked reward functions (a reward model's scorer last).
        weights: [num_rewards] one weight per function.
        args: the config (``missing_eos_penalty``, ``reward_timeout``).

    Example::

        rewards = RolloutRewards([accuracy_reward], torch.ones(1), GRPOConfig(output_dir="out"))
        scores = rewards.score(inputs, trainer.state)  # [N, 1]
        total = rewards.total(scores, no_eos)  # [N]
    """

    def __init__(self, funcs: list, weights: torch.Tensor, args) -> None:
        self.funcs, self.weights, self.args = funcs, weights, args

    @property
    def names(self) -> list[str]:
        """Each reward's name, as its metrics are logged (``rewards/<name>/mean``)."""
        return [reward_func_name(func) for func in self.funcs]

    def score(self, inputs: RewardInputs, state: TrainerState) -> torch.Tensor:
        """Scores [N, num_rewards] of the completions; the functions read ``state`` as ``trainer_state``."""
        return score_completions(self.funcs, inputs, state, self.args.reward_timeout)

    def total(self, scores: torch.Tensor, no_eos: torch.Tensor) -> torch.Tensor:
        """[N] each sample's total: the weighted sum of its scores [N, num_rewards] (a None score left out), less
        ``missing_eos_penalty`` where the completion ends without EOS (``no_eos`` [N])."""
        total = weighted_total(scores, self.weights)
        if self.args.missing_eos_penalty is None:
            return total
        return self.penalise_missing_eos(total, no_eos.to(total.device))

    def penalise_missing_eos(self, total: torch.Tensor, no_eos: torch.Tensor) -> torch.Tensor:
        return total - self.args.missing_eos_penalty * no_eos.float()


class NoRewards(RolloutRewards):
    """A run without rewards (distillation: the teacher is the signal): no scores, totals of 0."""

    def __init__(self, args) -> None:
        super().__init__([], torch.zeros(0), args)

    def score(self, inputs: RewardInputs, state: TrainerState) -> torch.Tensor:
        return torch.zeros(len(inputs.completion_ids), 0)


def trajectory_fields(generation: Generation) -> dict:
    """What a multi-turn generation adds to the reward inputs: the conversations and extra keyword arguments."""
    if not isinstance(generation, Trajectories):
        return {}
    fields = {"extra": generation.reward_kwargs}
    return fields if generation.completions is None else {**fields, "completions": generation.completions}


class Scorer:
    """Scores a sampled rollout's completions with ``rewards`` (reward functions and models, or online DPO's judge)
    on the inputs TRL's reward functions receive.

    Example::

        scores, metrics = Scorer(rewards, tokenizer, conversational=False, args=args)(sampled, trainer.state)
    """

    def __init__(self, rewards: RolloutRewards, tokenizer, conversational: bool, args) -> None:
        self.rewards, self.tokenizer, self.conversational, self.args = rewards, tokenizer, conversational, args

    def __call__(self, sampled: Sampled, state, tokenizer=None) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores [N, num_rewards] with ``state`` as ``trainer_state``, and the metrics the reward functions logged;
        ``tokenizer`` decodes (default the policy's; a worker thread passes its own)."""
        inputs = self.reward_inputs(sampled.prompts, sampled.prompt_ids, sampled.generation, sampled.columns, tokenizer)
        return self.rewards.score(inputs, state), inputs.metric_means()

    def reward_inputs(self, prompts, prompt_ids, generation: Generation, columns: dict, tokenizer=None) -> RewardInputs:
        """What reward functions and judges see of the completions, in TRL's conventions."""
        tok, kwargs = tokenizer or self.tokenizer, self.args.chat_template_kwargs
        texts = tok.batch_decode(generation.completion_ids, skip_special_tokens=True)
        inputs = RewardInputs(
            prompts=prompts,
            completions=as_completions(texts, self.conversational),
            completion_ids=generation.completion_ids,
            columns=columns,
            prompt_ids=prompt_ids,
            completion_texts=texts,
            prompt_texts=prompt_texts(prompts, tok, self.conversational, kwargs),
        )
        return dataclasses.replace(inputs, **trajectory_fields(generation))
