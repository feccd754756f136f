"""The algorithm's side of the on-policy trainer: the hooks an algorithm file (grpo.py, rloo.py, ppo.py,
online_dpo.py) overrides, with their defaults. ``compute_advantages`` and ``compute_loss_on_batch`` are required."""

from __future__ import annotations

import abc
import functools
import math

import torch
from transformers import TrainerState

from ...checkpoint.checkpointer import TrainedModule
from ...models.loading import enable_gradient_checkpointing
from ...ops import ends_without_eos
from ...ops.masked import SumOverProcesses
from ...rewards import RewardInputs, check_reward_funcs, score_completions
from ...rollout import Advantages, Rollout
from ..config.on_policy_config import OnPolicyConfig
from .loop_state import NoAlgorithmState, Stateful


class AlgorithmHooks(abc.ABC):
    """What differs between the algorithms of ``OnPolicyTrainer`` (a base of it: the hooks read its state)."""

    samples_per_group = 1  # mini-batches never split a group of this many consecutive samples (DPO: a pair)
    # whether the algorithm learns from rewards (reward functions, reward models, a judge); distillation learns from its
    # teacher instead, takes no reward_funcs, and its ``checked_rewards`` and ``score`` give none
    uses_rewards = True

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the log-probs the loss uses: the sampling temperature, the distribution samples came from."""
        return self.args.temperature

    checks_engine_in_loss = False  # whether the loss checks vLLM's log-probs (and corrects) with its own pass
    evaluates_loss = False  # whether evaluate() reports eval_loss: the loss of the evaluation rollout
    reads_engine_logprobs = False  # whether the loss reads vLLM's log-probs even where a scoring pass checked them

    def needs_old_logprobs(self) -> bool:
        """Whether the rollout needs a separate pass for the sampling policy's log-probs (the importance ratio's
        denominator). Not when each rollout is trained exactly once, in one optimizer step: the policy being trained
        is then the one that sampled, so the training pass's own log-probs (detached) are the same numbers."""
        return self.args.steps_per_rollout > 1

    def needs_reference(self, args: OnPolicyConfig) -> bool:
        """Whether the loss or the reward reads the reference's log-probs: with ``beta`` 0 there is no KL term, so
        no reference copy is made and no reference pass runs."""
        return args.beta > 0

    def initial_algorithm_state(self) -> Stateful:
        """What the algorithm carries from one rollout to the next (checkpointed with the loop state)."""
        return NoAlgorithmState()

    def checked_rewards(self, reward_funcs: list, args, dataset) -> tuple[list, torch.Tensor]:
        """The reward functions (a reward model last), checked against the dataset's columns, and one weight each."""
        return check_reward_funcs(reward_funcs, args.reward_weights, dataset, args.remove_unused_columns)

    def score(self, inputs: RewardInputs, state: TrainerState | None = None) -> torch.Tensor:
        """Scores [N, num_rewards] of the rollout's completions; ``reward_weights`` combines them. The functions read
        ``state`` as ``trainer_state`` (default: the trainer's)."""
        return score_completions(self.reward_funcs, inputs, state or self.state, self.args.reward_timeout)

    def penalise_missing_eos(self, total: torch.Tensor, no_eos: torch.Tensor) -> torch.Tensor:
        """The weighted scores [N] less ``missing_eos_penalty`` where a completion ends without EOS [N]."""
        return total - self.args.missing_eos_penalty * no_eos.float()

    @abc.abstractmethod
    def compute_advantages(self, rollout: Rollout) -> Advantages:
        """What the loss needs beyond the scored rollout, and the metrics to log; ``rollout`` stays unchanged."""

    @abc.abstractmethod
    def compute_loss_on_batch(self, model, batch: Rollout) -> tuple[torch.Tensor | dict, dict[str, float]]:
        """The loss of one micro-batch and its metrics. An algorithm that trains several modules may return
        ``{module name: loss}`` instead, one term per module (their parameters must be disjoint)."""

    def loss_mask(self, batch: Rollout) -> torch.Tensor:
        """[B, C] the completion tokens the loss averages over: all of them, or with
        ``mask_truncated_completions`` only those of completions that ended with EOS."""
        if not self.args.mask_truncated_completions:
            return batch.policy_mask
        cut = ends_without_eos(batch.completion_ids, batch.completion_mask, self.processing_class.eos_token_id)
        return batch.policy_mask * (~cut).unsqueeze(1)

    def tokens_per_micro_batch(self, rollout: Rollout) -> torch.Tensor:
        """[N] (one value, repeated): the rollout's loss tokens, over every process, per micro-batch; a loss that
        divides each micro-batch's token sum by it (``dapo``, distillation) is a token mean over the whole step."""
        tokens = self.loss_mask(rollout).sum().double()
        total = self.sum_over_processes()
        if total is not None:
            tokens = total(tokens.reshape(1))[0]
        # (an evaluation rollout may end with a smaller micro-batch: it counts as one)
        micro_batches = math.ceil(len(rollout) / self.args.micro_train_batch_size) * self.accelerator.num_processes
        return torch.full((len(rollout),), (tokens / micro_batches).item(), device=rollout.scores.device)

    def trained_modules(self) -> list[TrainedModule]:
        """Every model the run trains, the actor first (``self.model`` is what DDP or DeepSpeed wraps)."""
        return [
            TrainedModule("actor", self.model_wrapped, self.optimizer, self.lr_scheduler, self.model, self.save_actor)
        ]

    def prepare_for_training(self, max_steps: int) -> None:
        """Create the optimizers and schedulers and let accelerate prepare them with their models."""
        self.create_optimizer()
        if self.is_deepspeed_enabled:  # DeepSpeed drops parameter groups without parameters (under LoRA: the
            # no-weight-decay group); the scheduler must be made for the groups it steps
            self.optimizer.param_groups[:] = [group for group in self.optimizer.param_groups if group["params"]]
        self.create_scheduler(num_training_steps=max_steps, optimizer=self.optimizer)
        if self.args.gradient_checkpointing:
            enable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs)
        # Schedulers stay unprepared: accelerate would step them once per process for every optimizer step.
        self.model_wrapped, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)

    def sum_over_processes(self) -> SumOverProcesses | None:
        """An all-reduce sum over the processes, for statistics of the whole rollout (``masked_moments``); None on
        one process, whose share is the whole rollout."""
        if self.accelerator.num_processes == 1:
            return None
        return functools.partial(self.accelerator.reduce, reduction="sum")
