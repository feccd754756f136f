"""Checkpoints from the trainer's side: what a checkpoint of this run holds (its fingerprint, loop state, trained
and changing models), writing one, and stopping with one after a signal."""

from __future__ import annotations

import functools
import signal
from pathlib import Path

from transformers.utils import logging

from ...checkpoint import checkpoint_name
from ...checkpoint.checkpointer import CheckpointContents, ModelWeights
from ...distributed.processes import on_main_process
from ...models.peft import is_peft
from ...reporting.quiet import no_progress_bars
from ..config.resume_settings import split_settings
from .preemption import stopped_status

logger = logging.get_logger(__name__)


class SavingMixin:
    """The checkpoint half of ``OnPolicyTrainer`` (a mixin of it: it uses the trainer's state and checkpointer)."""

    def save_if_due(self, preempted: bool = False) -> bool:
        """Checkpoint this step if the callbacks decided so (every ``save_steps``); return whether one was written.
        ``preempted``: a signal asked the run to stop (``save_checkpoint``)."""
        if not self.control.should_save:
            return False
        self.save_checkpoint(preempted)
        self.control = self.callback_handler.on_save(self.args, self.state, self.control)
        self.control.should_save = False
        return True

    def stop_for_signal(self, signum: int | None, saved: bool) -> None:
        """After a SIGTERM / SIGINT before the last step: checkpoint this step (the one exception to save_steps),
        end, and exit with a non-zero status (``stopped_status``), so that a scheduler restarts the job."""
        if not saved:
            self.control.should_save = True
            self.save_if_due(preempted=True)
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)
        name = signal.Signals(signum).name if signum else "a signal on another process"
        logger.warning(
            f"Stopped by {name} after step {self.state.global_step}: {checkpoint_name(self.state.global_step)} "
            f"is in {self.args.output_dir}; run again with resume_from_checkpoint=True to continue."
        )
        raise SystemExit(stopped_status(signum))

    def run_fingerprint(self) -> dict:
        """What a resumed run must share with the run that wrote the checkpoint, besides the settings: what it
        started from and how its optimizer state is laid out (fingerprint.py). Not the number of processes, nor
        FSDP2: their optimizer state reshards to any number and to whole (``optimizer_reshard``), the change logged
        (``checkpoint_contents``). ZeRO's partitions reshard to another number of processes under the same stage."""
        return {
            "algorithm": self.algorithm_name,
            "zero_stage": self.zero_stage,
            **zero_partition_order(self.deepspeed_config, self.zero_stage, self.accelerator.num_processes),
            "peft": is_peft(self.model),
            "trained_modules": [module.name for module in self.trained_modules()],
            **self.identity,
        }

    def checkpoint_contents(self) -> CheckpointContents:
        fixed, free = split_settings(self.args)
        fingerprint = {**self.run_fingerprint(), **fixed}
        free = {**free, "world_size": self.accelerator.num_processes, "fsdp_version": self.fsdp_version}
        return CheckpointContents(
            self.trained_modules(),
            self.state,
            fingerprint,
            free,
            self.changing_weights(),
            self.accelerator.scaler,
        )

    def changing_weights(self) -> list[ModelWeights]:
        """Untrained models whose weights change during the run: the reference under ``sync_ref_model``."""
        if not self.args.sync_ref_model:
            return []
        reference = self.reference_module
        return [ModelWeights("reference", reference, functools.partial(self.save_pretrained_model, reference))]

    def save_checkpoint(self, preempted: bool = False) -> Path:
        """Write ``checkpoint-<global_step>`` atomically (every process), rotate, then publish its actor as
        ``hub_strategy`` asks. ``preempted``: without waiting for generation (max_staleness), which the same
        preemption may have stopped: what is not generated yet is stored as its request."""
        args, step = self.args, self.state.global_step
        if not preempted:
            self.rollout_source.drain()  # max_staleness: the rollouts in flight are stored, not lost
        with no_progress_bars():  # not one bar per model saved
            final = self.checkpointer.save(args.output_dir, step, self.checkpoint_contents(), args.save_total_limit)
        # the Hub's failures are reported and training goes on; any other error stops every process at once
        on_main_process(self.accelerator, lambda: self.push_checkpoint(final, step))
        return final


def zero_partition_order(deepspeed_config: dict | None, stage: int | None, processes: int) -> dict:
    """Under ZeRO-1/2, the order of the parameters in each optimizer partition: DeepSpeed's
    ``round_robin_gradients`` deals them out by the number of processes, so such a state resumes on that number only."""
    if stage not in (1, 2):
        return {}
    round_robin = (deepspeed_config.get("zero_optimization") or {}).get("round_robin_gradients", False)
    return {"zero_partition_order": f"round robin over {processes} processes" if round_robin else "parameter order"}
