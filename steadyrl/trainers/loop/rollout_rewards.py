"""How a rollout is rewarded: ``RolloutRewards`` scores completions with the reward functions and models, and gives
each sample its total. A trainer whose signal is not a weighted sum of rewards (online DPO's judge, distillation's
teacher) builds a subclass in ``make_rewards``."""

from __future__ import annotations

import torch
from transformers import TrainerState

from ...rewards import RewardInputs, reward_func_name, score_completions, weighted_total


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
