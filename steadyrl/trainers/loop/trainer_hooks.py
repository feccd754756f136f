"""What a trainer shell (grpo.py, ppo.py, ...) may override besides its config: the algorithm it builds, the models it
adds to the run (PPO's critic, distillation's teacher), the modules it trains, and the rewards it takes."""

from __future__ import annotations

from typing import ClassVar

import torch

from ...checkpoint.checkpointer import TrainedModule
from ...models.loading import enable_gradient_checkpointing
from ...rewards import check_reward_funcs
from .algorithm import Algorithm, Processes
from .rollout_rewards import RolloutRewards


class TrainerHooks:
    """The overridable parts of ``OnPolicyTrainer`` (a base of it: the hooks read the trainer's models and config)."""

    algorithm_class: ClassVar[type[Algorithm]]  # the algorithm the trainer builds (its class-level facts are read
    # before any model exists: ``uses_rewards``, ``needs_reference(args)``, ``samples_per_group``)

    def make_algorithm(self) -> Algorithm:
        """The algorithm, built from the config, the processes, the tokenizer's EOS and ``algorithm_inputs()``, once
        the models exist."""
        eos = self.processing_class.eos_token_id
        return self.algorithm_class(self.args, Processes(self.accelerator), eos, *self.algorithm_inputs())

    def algorithm_inputs(self) -> tuple:
        """What the algorithm is built with besides the config, the processes and EOS (GRPO: the policy and the reward
        weights; PPO: the critic; ...)."""
        return ()

    def add_algorithm_models(self) -> None:
        """Load the models the algorithm needs beyond the policy, the reference and the reward models (PPO's critic,
        distillation's teacher), before the algorithm is built."""

    def checked_rewards(self, reward_funcs: list, args, dataset) -> tuple[list, torch.Tensor]:
        """The reward functions (a reward model last), checked against the dataset's columns, and one weight each."""
        return check_reward_funcs(reward_funcs, args.reward_weights, dataset, args.remove_unused_columns)

    def make_rewards(self) -> RolloutRewards:
        """How the rollouts are rewarded: the checked reward functions and models with their weights."""
        return RolloutRewards(self.reward_funcs, self.reward_weights, self.args)

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
