"""No non-finite update is applied: each global step's verdict on every trained module's loss and gradient norm, the
running count of refused steps, and the stop after too many in a row.

A module's update is applied only where its loss (on every process) and its gradient norm (the global one: all-reduced
under DDP, whole under FSDP2, DeepSpeed's own under ZeRO) are finite; otherwise its weights, optimizer moments and LR
schedule stay as they were, as DeepSpeed skips an fp16 step whose gradients overflow. The step still counts (global_step
moves on, as in ``Trainer``): its mini-batch is spent. After ``max_consecutive_nonfinite_steps`` refused steps in a
row, the next one stops the run, as Megatron's NaN check stops it at the first: since no refused update reached the
weights, the newest checkpoint is then a healthy one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from transformers.utils import logging

logger = logging.get_logger(__name__)


class NonFiniteUpdateError(RuntimeError):
    """Too many global steps in a row had a non-finite loss or gradient: the run stops before the next one."""


@dataclass
class RefusedStep:
    """A global step whose update was refused for some module: ``step`` is the global step it made."""

    step: int
    reasons: dict[str, str]  # module name -> what was not finite ("loss nan", "grad_norm inf")
    prompts: list[int]  # the dataset rows of its mini-batch's prompts (every process's), sorted, once each


def verdicts(losses: dict[str, float], norms: dict[str, float | None]) -> dict[str, str]:
    """The modules whose update must be refused, each with the reason: a non-finite loss (summed over the
    micro-batches and the processes) or gradient norm. A norm of None is unknown here (DeepSpeed checks its own)."""
    refused = {}
    for name in dict.fromkeys([*losses, *norms]):
        loss, norm = losses.get(name, 0.0), norms.get(name)
        if not math.isfinite(loss):
            refused[name] = f"loss {loss}"
        elif norm is not None and not math.isfinite(norm):
            refused[name] = f"grad_norm {norm}"
    return refused


class UpdateGuard:
    """The run's record of refused steps, a checkpoint part (the same on every process: the verdict is agreed).

    ``limit``: the most refused steps in a row the run takes (``max_consecutive_nonfinite_steps``); the next one
    raises ``NonFiniteUpdateError``."""

    def __init__(self, limit: int, main_process: bool = True) -> None:
        self.limit, self.main_process = limit, main_process
        self.total = 0  # refused steps in the whole run
        self.in_a_row: list[RefusedStep] = []  # the refused steps since the last applied one

    def record(self, step: int, refused: dict[str, str], prompts: list[int], loss_scaled: bool = False) -> None:
        """Note global step ``step``'s verdict: nothing refused ends a streak; a refusal is said (main process) and
        counted, and one past ``limit`` in a row raises. ``loss_scaled``: fp16 loss scaling is on, whose scale search
        overflows the gradients now and then: such a step (finite losses) is skipped and counted, but is no fault."""
        if not refused:
            self.in_a_row = []
            return
        self.total += 1
        if loss_scaled and all(reason.startswith("grad_norm") for reason in refused.values()):
            if self.main_process:
                logger.info(f"Step {step}: the fp16 loss scale overflowed the gradients; the step was skipped.")
            return
        self.in_a_row.append(RefusedStep(step, refused, prompts))
        if len(self.in_a_row) > self.limit:
            raise NonFiniteUpdateError(self.stop_message())
        if self.main_process:
            logger.warning(
                f"Step {step}: skipped the update of {describe(refused)}; the weights, optimizer state and learning "
                f"rate stay as they were ({self.total} step(s) skipped in this run, {len(self.in_a_row)} in a row of "
                f"at most max_consecutive_nonfinite_steps={self.limit})."
            )

    def stop_message(self) -> str:
        steps = self.in_a_row
        lines = [f"  step {s.step}: {describe(s.reasons)}; prompts (dataset rows) {s.prompts}" for s in steps]
        return (
            f"{len(steps)} global steps in a row had a non-finite loss or gradient (max_consecutive_nonfinite_steps="
            f"{self.limit}); stopping before any of them reaches the weights:\n"
            + "\n".join(lines)
            + "\nNo refused update was applied, so the newest checkpoint holds healthy weights. Look for the cause in "
            "those prompts' rewards and completions (a reward of inf or NaN, a log of zero, a 0/0 in a normalisation) "
            "or in the learning rate, then resume with resume_from_checkpoint=True (raise "
            "max_consecutive_nonfinite_steps to skip past more steps)."
        )

    def state_dict(self) -> dict:
        return {"total": self.total, "in_a_row": [asdict(step) for step in self.in_a_row]}

    def load_state_dict(self, state: dict) -> None:
        self.total = state["total"]
        self.in_a_row = [RefusedStep(**step) for step in state["in_a_row"]]


def describe(refused: dict[str, str]) -> str:
    return ", ".join(f"the {name} ({reason})" for name, reason in refused.items())
