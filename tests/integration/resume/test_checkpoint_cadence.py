"""One global step per optimizer update; checkpoints exactly at multiples of save_steps; rotation keeps the newest."""

import pytest
from conftest import run_entries
from support.toy_run import make_trainer
from transformers import TrainerCallback

from steadyrl import GlobalStepError, RLOOTrainer
from steadyrl.checkpoint import scan_checkpoints


class RecordSteps(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


@pytest.mark.parametrize("accumulation", [1, 2, 4])
@pytest.mark.parametrize("epochs", [1, 2])
def test_checkpoints_exactly_at_multiples_of_save_steps(tmp_path, accumulation, epochs):
    recorder = RecordSteps()
    trainer = make_trainer(
        tmp_path,
        callbacks=[recorder],
        train_batch_size=4,
        micro_train_batch_size=4 // accumulation,
        num_ppo_epochs=epochs,
        max_steps=11,
        save_steps=3,
        max_completion_length=4,
    )
    assert trainer.args.gradient_accumulation_steps == accumulation
    trainer.train()
    assert recorder.steps == list(range(1, 12))
    assert [step for step, _ in scan_checkpoints(tmp_path).complete] == [3, 6, 9]
    assert run_entries(tmp_path) == ["checkpoint-3", "checkpoint-6", "checkpoint-9"]


def test_save_total_limit_keeps_the_newest(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=8, save_steps=2, save_total_limit=2, max_completion_length=4)
    trainer.train()
    assert run_entries(tmp_path) == ["checkpoint-6", "checkpoint-8"]


def test_save_final_checkpoint_adds_the_last_step_only(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=5, save_steps=2, save_final_checkpoint=True, max_completion_length=4)
    trainer.train()
    assert [step for step, _ in scan_checkpoints(tmp_path).complete] == [2, 4, 5]


class DoubleStepRLOO(RLOOTrainer):
    """Deliberately broken: advances global_step a second time inside the optimizer step."""

    def train_on_minibatch(self, minibatch):
        metrics = super().train_on_minibatch(minibatch)
        if self.state.global_step == 4:
            self.state.global_step += 1
        return metrics


def test_global_step_callback_stops_a_double_advance(tmp_path):
    trainer = make_trainer(tmp_path, trainer_cls=DoubleStepRLOO, max_steps=8, save_steps=5, max_completion_length=4)
    with pytest.raises(GlobalStepError, match="global_step went from 4 to 6 in one optimizer update; expected 5"):
        trainer.train()
    assert not list(tmp_path.glob("checkpoint-*")), "no checkpoint may be written for a skipped step"


def test_callbacks_work_with_a_plain_transformers_trainer(tmp_path, toy_path):
    """Plain Trainer would also save at the final step (7); CheckpointCallback keeps only multiples of save_steps."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from steadyrl import CheckpointCallback, GlobalStepCallback

    data = Dataset.from_dict({"input_ids": [[3, 4, 5, 6]] * 16, "labels": [[3, 4, 5, 6]] * 16})
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=7,
        save_steps=3,
        per_device_train_batch_size=2,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = Trainer(
        model=AutoModelForCausalLM.from_pretrained(toy_path),
        args=args,
        train_dataset=data,
        callbacks=[GlobalStepCallback(), CheckpointCallback()],
    )
    trainer.train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert [step for step, _ in scan_checkpoints(tmp_path).complete] == [3, 6], "each has a valid manifest"


class RecordEvents(TrainerCallback):
    """(event, global_step) for each step-level callback, in order."""

    def __init__(self):
        self.events = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.events.append(("begin", state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("end", state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append(("log", state.global_step))

    def on_save(self, args, state, control, **kwargs):
        self.events.append(("save", state.global_step))


def test_a_step_begins_before_the_rollout_it_needs_and_callbacks_come_in_trainers_order(tmp_path, toy_path):
    """4 steps per rollout (8 samples, train_batch_size 4, 2 epochs): steps 1 and 5 make one, as part of the step,
    so a callback timing a step from on_step_begin to on_step_end sees the whole of it."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    recorder = RecordEvents()
    trainer = make_trainer(tmp_path / "rl", callbacks=[recorder], max_steps=5, save_steps=3, max_completion_length=4)
    make_rollout_buffer = trainer.make_rollout_buffer

    def recorded_rollout():
        recorder.events.append(("rollout", trainer.state.global_step))
        return make_rollout_buffer()

    trainer.make_rollout_buffer = recorded_rollout
    trainer.train()
    steps = [[("begin", s), ("end", s + 1), ("log", s + 1)] + [("save", 3)] * (s == 2) for s in range(5)]
    for s in (0, 4):
        steps[s].insert(1, ("rollout", s))
    assert recorder.events == [event for step in steps for event in step] + [("log", 5)]  # and the summary's

    plain = RecordEvents()  # transformers.Trainer's order for the same schedule
    data = Dataset.from_dict({"input_ids": [[3, 4, 5, 6]] * 16, "labels": [[3, 4, 5, 6]] * 16})
    args = TrainingArguments(
        output_dir=str(tmp_path / "plain"),
        max_steps=5,
        save_steps=3,
        logging_steps=1,
        per_device_train_batch_size=2,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    Trainer(
        model=AutoModelForCausalLM.from_pretrained(toy_path), args=args, train_dataset=data, callbacks=[plain]
    ).train()
    without_rollouts = [event for event in recorder.events[:-1] if event[0] != "rollout"]
    assert without_rollouts == plain.events[: len(without_rollouts)], plain.events
