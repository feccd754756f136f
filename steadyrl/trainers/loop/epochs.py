"""``Trainer``'s epochs in the on-policy loop: ``on_epoch_begin`` and ``on_epoch_end`` where ``Trainer`` fires them,
and ``should_epoch_stop``.

An epoch is a pass of the prompt sampler over ``train_dataset``. A rollout belongs to the pass its first prompt comes
from, so an epoch ends after the last step of the last rollout that begins in its pass (a rollout that runs on into
the next pass is trained in the epoch it began in), or with the run's last step. As in ``Trainer``:

    on_epoch_begin      before the first ``on_step_begin`` of each epoch and of every ``train()`` call (a resumed run
                        begins with one, in the middle of an epoch too); it resets ``should_epoch_stop``
    on_epoch_end        after the epoch's last step has logged, evaluated and saved as its flags said; the flags are
                        then read once more (``logging_strategy="epoch"``, or a callback's in ``on_epoch_end``)
    should_epoch_stop   ends the epoch after the current step; the next one begins with a new rollout from the
                        next pass (the rest of the rollout, of the rollouts generated ahead and of a map-style
                        dataset's pass are skipped, as ``Trainer`` skips the rest of its epoch's batches)

The pass a rollout began in is a checkpoint part, so a resumed run ends its epochs where the uninterrupted run does.
"""

from __future__ import annotations

import weakref

from ...data.sampling import PromptSampler
from ...data.stream import StreamSampler


class Epochs:
    """The epoch events of ``trainer``'s loop over the prompts of ``sampler`` (drawn ``rollout_batch_size`` at a time
    by ``source``, which may hold draws not trained on yet: ``max_staleness``). Not a stage but the trainer's own event
    machinery, as ``Trainer``'s epoch loop is: it fires the trainer's callbacks, logs and saves through it, and reads
    its control flags; it holds the trainer weakly (the trainer holds it)."""

    def __init__(self, trainer, sampler, source, rollout_batch_size: int) -> None:
        self._trainer = weakref.ref(trainer)
        self.sampler, self.source, self.rollout_batch_size = sampler, source, rollout_batch_size
        self.rollout_pass: int | None = None  # the pass the rollout being trained on began in
        self.open = False  # an epoch has begun in this train() call and not ended
        self.skip_pending = False  # resumed from a checkpoint saved after should_epoch_stop, before the skip

    @property
    def trainer(self):
        return self._trainer()

    def pass_of(self, prompts_back: int = 0) -> int:
        """The pass of the prompt ``prompts_back`` before the next one training will use: the sampler's position,
        less the prompts drawn ahead and not trained on yet."""
        queued = len(getattr(self.source, "ahead", ())) * self.rollout_batch_size + prompts_back
        if isinstance(self.sampler, StreamSampler):
            length = self.sampler.epoch_rows
            if length is None:  # a stream's length is known once a pass has ended: it is still in its first
                return self.sampler.epoch_index
            return (self.sampler.epoch_index * length + self.sampler.rows_in_epoch - queued) // length
        return (self.sampler.consumed - queued) // self.sampler.num_prompts

    def rollout_begins(self) -> None:
        """A new rollout is about to be drawn: it belongs to the pass of its first prompt."""
        self.rollout_pass = self.pass_of()

    def begin_if_new(self) -> None:
        """``on_epoch_begin`` before a step that begins an epoch (or this ``train()`` call)."""
        if self.skip_pending:
            self.skip_rest_of_pass()
        if not self.open:
            trainer = self.trainer
            trainer.control = trainer.callback_handler.on_epoch_begin(trainer.args, trainer.state, trainer.control)
            self.open = True

    def end_if_due(self, max_steps: int, preempted: bool = False, stopping: bool = False) -> bool:
        """After a step's log, evaluation and checkpoint: ``on_epoch_end`` if the step ends its epoch (the pass is
        done, ``should_epoch_stop``, the run ends: ``should_training_stop``, ``max_steps``, ``stopping`` for a
        signal), then log, evaluate and save as the flags say; return whether a checkpoint was written."""
        trainer = self.trainer
        control, state = trainer.control, trainer.state
        ending = control.should_training_stop or state.global_step >= max_steps or stopping
        if not (ending or control.should_epoch_stop or self.pass_done()):
            return False
        skip = control.should_epoch_stop and not ending
        self.open = False
        trainer.control = trainer.callback_handler.on_epoch_end(trainer.args, state, trainer.control)
        if trainer.control.should_log and not trainer.pending_metrics.values:  # Trainer: no step since the last log
            trainer.control.should_log = False
        trainer.report_step()
        saved = trainer.save_if_due(preempted)
        if skip:
            self.skip_rest_of_pass()
        return saved

    def began(self) -> int:
        """The pass the rollout being trained on began in."""
        if self.rollout_pass is None:  # a checkpoint of an older version, resumed in the middle of a rollout
            return self.pass_of(prompts_back=self.rollout_batch_size)
        return self.rollout_pass

    def pass_done(self) -> bool:
        """Whether the rollout just finished is the last to begin in its pass."""
        return self.trainer.training_buffer.needs_rollout and self.pass_of() != self.began()

    def skip_rest_of_pass(self) -> None:
        """``should_epoch_stop``: the next step draws a new rollout from the start of the next pass (a stream goes on
        from where it is: its position moves only by reading it)."""
        following, self.skip_pending = self.began() + 1, False
        self.trainer.training_buffer.buffer = None
        if getattr(self.source, "ahead", None):
            self.source.drain()
            self.source.ahead.clear()
        if isinstance(self.sampler, PromptSampler):
            self.sampler.consumed = following * self.sampler.num_prompts

    def state_dict(self) -> dict:
        """The pass the rollout began in, and whether ``should_epoch_stop`` was set when this checkpoint of the
        epoch's last step was written (its skip comes after the checkpoint: a resume makes it first)."""
        control = self.trainer.control
        return {"rollout_pass": self.rollout_pass, "skip_pending": bool(control and control.should_epoch_stop)}

    def load_state_dict(self, state: dict) -> None:
        self.rollout_pass, self.skip_pending = state["rollout_pass"], state.get("skip_pending", False)
