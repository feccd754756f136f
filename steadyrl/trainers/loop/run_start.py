"""The start of a ``train()`` call: its ``TrainerState``, fresh or restored from a checkpoint with every registered
part (the LR schedules of a changed ``max_steps`` too), the log lines a killed run wrote after that checkpoint cut,
``on_train_begin``, and the RNG restored last of all."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerState

from ...checkpoint.ownership import supersede_newer
from ...checkpoint.schedule_change import resume_schedules
from ...distributed.processes import on_main_process


def start_run(trainer, checkpoint: Path | None, max_steps: int) -> None:
    """Set ``trainer.state`` for a run of ``max_steps`` from ``checkpoint`` (or from the start) and begin it."""
    args = trainer.args
    trainer.state = TrainerState(
        is_local_process_zero=trainer.is_local_process_zero(), is_world_process_zero=trainer.is_world_process_zero()
    )
    trainer.state.train_batch_size, trainer.state.max_steps = args.train_batch_size, max_steps
    trainer.state.compute_steps(args, max_steps)
    trainer.meter.reset()
    if checkpoint is not None:  # models, optimizers, TrainerState and every registered part, in place
        trainer.checkpointer.load(checkpoint, trainer.checkpoint_contents())
        on_main_process(trainer.accelerator, lambda: supersede_newer(args.output_dir, checkpoint))
        modules = trainer.trained_modules()
        ours = [m.scheduler for m in modules if m.name != "actor" or trainer._created_lr_scheduler]
        main = trainer.is_world_process_zero()
        resume_schedules(args, checkpoint, trainer.state.global_step, max_steps, ours, main)
    trainer.meter.begin(trainer.state.global_step)
    if trainer.metrics_log is not None:  # lines a killed run wrote after its checkpoint
        trainer.metrics_log.truncate_after(trainer.meter.start_step)
    if args.log_completions and trainer.completion_log is not None:
        trainer.completion_log.truncate_after(trainer.meter.start_step)
    trainer.control = trainer.callback_handler.on_train_begin(args, trainer.state, trainer.control)
    if checkpoint is not None:
        trainer.checkpointer.restore_rng(checkpoint)
