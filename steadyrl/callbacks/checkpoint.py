"""CheckpointCallback: a checkpoint exactly when global_step % save_steps == 0."""

from __future__ import annotations

import os

from transformers import TrainerCallback
from transformers.trainer_utils import SaveStrategy

from ..checkpoint import checkpoint_name, write_manifest
from ..checkpoint.manifest import STATE_FILE


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
        directory = os.path.join(args.output_dir, checkpoint_name(state.global_step))
        # Trainer has just (re)written it, over any earlier manifest; a steadyrl trainer's is committed already
        written_by_trainer = os.path.isdir(directory) and not os.path.exists(os.path.join(directory, STATE_FILE))
        if args.should_save and written_by_trainer:
            write_manifest(directory, state.global_step, layout="transformers")
        return control
