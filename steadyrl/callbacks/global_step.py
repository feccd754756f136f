"""GlobalStepCallback: global_step rises by exactly one per optimizer update, on every rank."""

from __future__ import annotations

import torch.distributed as dist
from transformers import TrainerCallback


class GlobalStepError(RuntimeError):
    """global_step did not advance by exactly one in an optimizer update, or ranks disagree."""


class GlobalStepCallback(TrainerCallback):
    """Checks at every step that ``global_step`` goes ``s -> s + 1``: it never skips or repeats.

    Works with any ``transformers.Trainer``: the step counter seen at ``on_step_begin`` must be
    exactly one less than the one seen at the matching ``on_step_end``. In a distributed run all
    ranks must report the same value.
    """

    def __init__(self) -> None:
        self._step_at_begin: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._step_at_begin = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_at_begin = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        before, after = self._step_at_begin, state.global_step
        if before is not None and after != before + 1:
            raise GlobalStepError(
                f"global_step went from {before} to {after} in one optimizer update; expected {before + 1}. "
                "Something advanced the step counter outside the optimizer step."
            )
        self._step_at_begin = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            steps = [None] * dist.get_world_size()
            dist.all_gather_object(steps, after)
            if len(set(steps)) != 1:
                raise GlobalStepError(f"ranks disagree on global_step after an optimizer update: {steps}")
