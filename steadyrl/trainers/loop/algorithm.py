"""The algorithm as an object the trainer holds: ``Algorithm`` (what every algorithm answers) and ``Processes`` (the
collectives its statistics need). A trainer builds its algorithm from the config and the modules it made
(``OnPolicyTrainer.make_algorithm``); the loop then asks it, in order::

    needs_old_logprobs(), logprob_temperature, ...     the facts the scoring passes read
    advantages(rollout) -> Advantages                  once per rollout
    begin_step(global_step)                            before each optimizer step's micro-batches
    loss(model, micro_batch) -> (loss, metrics)        per micro-batch
    end_step(refused) -> metrics                       after the optimizer step

An algorithm keeps what it carries between rollouts in ``state`` (a checkpoint part, "algorithm").
"""

from __future__ import annotations

import abc
import functools
import math
from typing import ClassVar

import torch

from ...ops import ends_without_eos
from ...ops.masked import SumOverProcesses
from ...rollout import Advantages, Rollout
from ..config.on_policy_config import OnPolicyConfig
from .loop_state import NoAlgorithmState, Stateful


class Processes:
    """The processes' collectives an algorithm's statistics over the whole rollout need (one process: none)."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator
        self.count = accelerator.num_processes

    @property
    def sum(self) -> SumOverProcesses | None:
        """An all-reduce sum over the processes (``masked_moments``' ``total``); None on one process, whose share is
        the whole rollout."""
        if self.count == 1:
            return None
        return functools.partial(self.accelerator.reduce, reduction="sum")

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Every process's ``values`` (the same shape on each), concatenated along the first dimension."""
        return values if self.count == 1 else self.accelerator.gather(values)

    def pooled(self, values: torch.Tensor) -> torch.Tensor:
        """Every process's ``values`` [n_i] (any n_i, all >= 0), concatenated (this process's alone on one)."""
        if self.count == 1:
            return values
        sentinel = -1e9  # below every value pooled (entropies), so no real value equals it
        padded = self.accelerator.pad_across_processes(values, dim=0, pad_index=sentinel)
        gathered = self.accelerator.gather(padded)
        return gathered[gathered != sentinel]


class Algorithm(abc.ABC):
    """What differs between the on-policy algorithms: advantages, the loss, the state they carry, and the facts the
    loop asks about. Built once per trainer from the config and its inputs (never the trainer).

    Args:
        args: the algorithm's config.
        processes: the collectives over the training processes.
        eos_token_id: the policy tokenizer's EOS (``mask_truncated_completions``).

    Example::

        class SignOfReward(Algorithm):  # REINFORCE with the reward's sign as the advantage
            def advantages(self, rollout):
                return Advantages(advantages=rollout.scores.sign())

            def loss(self, model, batch):
                logprobs, _ = completion_logprobs(
                    model, *batch.token_tensors, temperature=self.args.temperature, images=batch.images
                )
                return -(logprobs * batch.advantages[:, None] * batch.policy_mask).sum() / batch.policy_mask.sum(), {}
    """

    # mini-batches never split a group of this many consecutive samples (online DPO: a pair)
    samples_per_group: ClassVar[int] = 1
    # whether it learns from rewards (reward functions, reward models, a judge); distillation learns from a teacher
    uses_rewards: ClassVar[bool] = True
    checks_engine_in_loss: ClassVar[bool] = False  # the loss checks vLLM's log-probs (and corrects) with its own pass
    evaluates_loss: ClassVar[bool] = False  # evaluate() reports eval_loss: the loss of the evaluation rollout
    takes_images: ClassVar[bool] = True  # it trains on prompts with images (a vision-language model's)
    reads_engine_logprobs: ClassVar[bool] = False  # the loss reads vLLM's log-probs even where a pass checked them

    def __init__(self, args: OnPolicyConfig, processes: Processes, eos_token_id: int | None) -> None:
        self.args, self.processes, self.eos_token_id = args, processes, eos_token_id
        self.state: Stateful = NoAlgorithmState()

    @classmethod
    def needs_reference(cls, args: OnPolicyConfig) -> bool:
        """Whether the loss or the reward reads the reference's log-probs (asked before any model is made): with
        ``beta`` 0 there is no KL term, so no reference copy is made and no reference pass runs."""
        return args.beta > 0

    def needs_old_logprobs(self) -> bool:
        """Whether the rollout needs a separate pass for the sampling policy's log-probs (the importance ratio's
        denominator). Not when each rollout is trained exactly once, in one optimizer step: the policy being trained
        is then the one that sampled, so the training pass's own log-probs (detached) are the same numbers."""
        return self.args.steps_per_rollout > 1

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the log-probs the loss uses: the sampling temperature, the distribution samples came from."""
        return self.args.temperature

    @abc.abstractmethod
    def advantages(self, rollout: Rollout) -> Advantages:
        """What the loss needs beyond the scored rollout, and the metrics to log; ``rollout`` stays unchanged."""

    @abc.abstractmethod
    def loss(self, model: torch.nn.Module, batch: Rollout) -> tuple[torch.Tensor | dict, dict[str, float]]:
        """The loss of one micro-batch and its metrics. An algorithm that trains several modules may return
        ``{module name: loss}`` instead, one term per module (their parameters must be disjoint)."""

    def begin_step(self, global_step: int) -> None:  # noqa: B027 (optional, as end_step)
        """Called before the micro-batches of the optimizer step that makes ``global_step`` + 1."""

    def end_step(self, refused: dict[str, str]) -> dict[str, float]:
        """Called after the optimizer step (``refused``: the modules whose update was not applied); its metrics."""
        return {}

    def loss_mask(self, batch: Rollout) -> torch.Tensor:
        """[B, C] the completion tokens the loss averages over: all of them, or with
        ``mask_truncated_completions`` only those of completions that ended with EOS."""
        if not self.args.mask_truncated_completions:
            return batch.policy_mask
        cut = ends_without_eos(batch.completion_ids, batch.completion_mask, self.eos_token_id)
        return batch.policy_mask * (~cut).unsqueeze(1)

    def tokens_per_micro_batch(self, rollout: Rollout) -> torch.Tensor:
        """[N] (one value, repeated): the rollout's loss tokens, over every process, per micro-batch; a loss that
        divides each micro-batch's token sum by it (``dapo``, distillation) is a token mean over the whole step."""
        tokens = self.loss_mask(rollout).sum().double()
        total = self.processes.sum
        if total is not None:
            tokens = total(tokens.reshape(1))[0]
        # (an evaluation rollout may end with a smaller micro-batch: it counts as one)
        micro_batches = math.ceil(len(rollout) / self.args.micro_train_batch_size) * self.processes.count
        return torch.full((len(rollout),), (tokens / micro_batches).item(), device=rollout.scores.device)
