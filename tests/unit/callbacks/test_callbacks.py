"""The callbacks on their own, driven as transformers.Trainer drives them: GlobalStepCallback refuses a step counter
that skips or repeats, CheckpointCallback saves exactly on the save_steps grid and finishes a plain Trainer's
checkpoint with a manifest. In training runs: tests/integration/resume/test_checkpoint_cadence.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState
from transformers.trainer_utils import SaveStrategy

from steadyrl.callbacks import CheckpointCallback, GlobalStepCallback, GlobalStepError
from steadyrl.checkpoint import verify_checkpoint


def one_update(callback: GlobalStepCallback, state: TrainerState, advance: int) -> None:
    callback.on_step_begin(None, state, TrainerControl())
    state.global_step += advance
    callback.on_step_end(None, state, TrainerControl())


def test_global_step_must_rise_by_exactly_one_per_update():
    callback, state = GlobalStepCallback(), TrainerState(global_step=4)
    callback.on_train_begin(None, state, TrainerControl())
    one_update(callback, state, 1)
    assert state.global_step == 5
    with pytest.raises(GlobalStepError, match="global_step went from 5 to 7 in one optimizer update; expected 6"):
        one_update(callback, state, 2)
    with pytest.raises(GlobalStepError, match="global_step went from 7 to 7 in one optimizer update; expected 8"):
        one_update(callback, state, 0)


def test_a_step_end_without_its_begin_is_not_judged():
    """A resumed run's first step_end may come without the begin this callback saw (on_train_begin forgets it)."""
    callback, state = GlobalStepCallback(), TrainerState(global_step=3)
    callback.on_step_begin(None, state, TrainerControl())
    callback.on_train_begin(None, state, TrainerControl())
    state.global_step = 10
    callback.on_step_end(None, state, TrainerControl())


def saved_steps(callback: CheckpointCallback, save_steps: int, max_steps: int, strategy=SaveStrategy.STEPS) -> list:
    """The steps at which ``callback`` leaves should_save set, with Trainer's own rule asking for a save at every
    step (which the callback must override either way)."""
    args, state = SimpleNamespace(save_strategy=strategy), TrainerState(save_steps=save_steps, max_steps=max_steps)
    saved = []
    for step in range(1, max_steps + 1):
        state.global_step = step
        control = TrainerControl(should_save=True)
        if callback.on_step_end(args, state, control).should_save:
            saved.append(step)
    return saved


def test_checkpoints_fall_exactly_on_the_save_steps_grid():
    assert saved_steps(CheckpointCallback(), save_steps=4, max_steps=10) == [4, 8]
    assert saved_steps(CheckpointCallback(save_final_checkpoint=True), save_steps=4, max_steps=10) == [4, 8, 10]
    assert saved_steps(CheckpointCallback(), save_steps=0, max_steps=3) == []
    every = list(range(1, 4))
    assert saved_steps(CheckpointCallback(), 2, 3, strategy=SaveStrategy.EPOCH) == every, "another strategy: Trainer's"


def test_a_plain_trainer_checkpoint_is_finished_with_a_manifest(tmp_path):
    checkpoint = tmp_path / "checkpoint-6"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text('{"global_step": 6}')
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    args = SimpleNamespace(should_save=True, output_dir=str(tmp_path))
    CheckpointCallback().on_save(args, TrainerState(global_step=6), TrainerControl())
    manifest = verify_checkpoint(checkpoint)
    assert (manifest["global_step"], manifest["layout"]) == (6, "transformers")
    assert sorted(manifest["files"]) == ["model.safetensors", "trainer_state.json"]
