"""CheckpointCallback: a checkpoint exactly when global_step % save_steps == 0."""

from __future__ import annotations

from transformers import TrainerCallback
from transformers.trainer_utils import SaveStrategy

from ..checkpoint.files import finish_trainer_checkpoint


class CheckpointCallback(TrainerCallback):
    """Decides when to save, by the global step alone.

    ``should_save`` is set exactly when ``global_step % save_steps == 0`` (and at the last step
    when ``save_final_checkpoint`` is true), and cleared otherwise, so no other rule — a final-step
    save, an epoch boundary, a ratio rounded differently — can add or drop a checkpoint.

    steadyrl trainers write the checkpoint atomically themselves. Under a plain
    ``transformers.Trainer`` the callback writes the sha256 manifest each time Trainer has written the
    directory (again when Trainer writes a ``checkpoint-N`` over an existing one), so ``steadyrl``
    resume logic accepts only directories that were finished.
    """

    def __init__(self, save_final_checkpoint: bool = False) -> None:
        self.save_final_checkpoint = save_final_checkpoint

    def on_step_end(self, args, state, control, **kwargs):
        if args.save_strategy != SaveStrategy.STEPS:
            return control
        due = state.save_steps > 0 and state.global_step % state.save_steps == 0
        final = self.save_final_checkpoint and state.global_step >= state.max_steps
        control.should_save = bool(due or final)
        return control

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:
            finish_trainer_checkpoint(args.output_dir, state.global_step)
        return control
