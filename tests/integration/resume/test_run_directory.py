"""One run per output directory, and a resume that refuses what it cannot honour: the lock, fresh starts in a
directory holding checkpoints, resuming an older checkpoint, the fingerprint, and low-precision weights."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import run_entries, step_entries
from datasets import Dataset
from support.toy_run import make_config, make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from steadyrl import RLOOTrainer
from steadyrl.checkpoint import CheckpointError
from steadyrl.checkpoint.ownership import OutputDirInUse
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path


@pytest.fixture(scope="module")
def old_run(tmp_path_factory) -> Path:
    """A finished run that left checkpoint-2 and checkpoint-4 (save_total_limit=2)."""
    output_dir = tmp_path_factory.mktemp("old-run")
    make_trainer(output_dir, max_steps=4, save_steps=2, save_total_limit=2).train()
    return output_dir


def copy_run(old_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(old_run, tmp_path / "run"))


def names(directory: Path) -> list[str]:
    return run_entries(directory)


def test_a_fresh_start_refuses_another_runs_checkpoints_and_overwrite_deletes_them(old_run, tmp_path):
    run = copy_run(old_run, tmp_path)
    with pytest.raises(CheckpointError, match=r"holds checkpoints of another run \(checkpoint-2, checkpoint-4\)"):
        make_trainer(run, max_steps=2, save_steps=1, save_total_limit=2).train()
    assert names(run) == ["checkpoint-2", "checkpoint-4"]  # untouched, and no lock file left behind

    trainer = make_trainer(run, max_steps=3, save_steps=1, save_total_limit=2, overwrite_output_dir=True)
    trainer.train()
    assert names(run) == ["checkpoint-2", "checkpoint-3"]  # the new run's own: rotation kept the newest two
    resumed = make_trainer(run, max_steps=4, save_steps=1, save_total_limit=2)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.log_history[0]["step"] == 1 and resumed.state.global_step == 4
    assert [entry["step"] for entry in step_entries(resumed.state.log_history)] == [1, 2, 3, 4]


def test_partial_checkpoints_of_a_run_killed_in_its_first_save_do_not_block_a_fresh_start(tmp_path):
    (tmp_path / "tmp-checkpoint-2").mkdir()
    (tmp_path / "tmp-checkpoint-2" / "optimizer.pt").write_bytes(b"partial")
    make_trainer(tmp_path, max_steps=1, save_steps=1).train()
    assert names(tmp_path) == ["checkpoint-1"]


def test_resuming_an_older_checkpoint_moves_the_newer_ones_aside(old_run, tmp_path):
    run = copy_run(old_run, tmp_path)
    trainer = make_trainer(run, max_steps=4, save_steps=1, save_total_limit=2)
    trainer.train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert trainer.state.global_step == 4
    aside = [name for name in names(run) if name.startswith("superseded-")]
    assert len(aside) == 1 and names(run / aside[0]) == ["checkpoint-4"]  # the old run's, kept whole
    assert sorted(set(names(run)) - set(aside)) == ["checkpoint-3", "checkpoint-4"]
    # the new checkpoint-4 descends from checkpoint-2: its log history starts with the old run's first two steps
    import json

    state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"]] == [1, 2, 3, 4]


def test_a_refused_resume_moves_nothing(old_run, tmp_path):
    run = copy_run(old_run, tmp_path)
    with pytest.raises(CheckpointError, match="learning_rate: checkpoint 0.001, now 0.05"):
        make_trainer(run, max_steps=4, learning_rate=5e-2).train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert names(run) == ["checkpoint-2", "checkpoint-4"]


HOLDER = textwrap.dedent("""
    import sys, time
    from steadyrl.checkpoint.ownership import OutputDirLock
    lock = OutputDirLock(sys.argv[1])
    lock.acquire()
    print("locked", flush=True)
    time.sleep(600)
""")


def test_a_second_run_on_a_locked_directory_fails_at_once_and_a_dead_holders_lock_does_not_block(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        trainer = make_trainer(tmp_path, max_steps=1, save_steps=1)
        with pytest.raises(OutputDirInUse, match=rf"in use by another run \(process {holder.pid} on host .+, since"):
            trainer.train()
        assert trainer.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))
    finally:
        holder.kill()  # SIGKILL: no chance to unlock; the kernel drops the lock with the process
        holder.wait()
    assert (tmp_path / ".steadyrl-run.lock").exists()  # a stale lock file is left behind ...
    trainer.train()  # ... and does not block
    assert names(tmp_path) == ["checkpoint-1"]


def changed_dataset() -> Dataset:
    rows = toy_dataset().to_dict()
    rows["prompt"] = [prompt[::-1] for prompt in rows["prompt"]]  # same size, other content
    return Dataset.from_dict(rows)


def other_reward(completions, **kwargs):
    return [0.0 for _ in completions]


def perturbed_model():
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # the same config, other weights
    return model


def other_chat_template():
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tokenizer


@pytest.mark.parametrize(
    "change, expected",
    [
        (dict(learning_rate=5e-2), "learning_rate: checkpoint 0.001, now 0.05"),
        (dict(lr_scheduler_type="cosine"), "lr_scheduler_type: checkpoint 'linear', now 'cosine'"),
        (dict(seed=1), "seed: checkpoint 0, now 1"),
        (dict(temperature=0.7), "temperature: checkpoint 1.0, now 0.7"),
        (dict(max_completion_length=6), "max_completion_length: checkpoint 8, now 6"),
        (dict(cliprange=0.1), "cliprange: checkpoint 0.2, now 0.1"),
        (dict(beta=0.1), "beta: checkpoint 0.05, now 0.1"),
        (dict(train_dataset=changed_dataset), "dataset: checkpoint '"),
        (dict(reward_funcs=[other_reward]), "reward_funcs: checkpoint .*letters_reward.*, now .*other_reward"),
        (dict(model=perturbed_model), "model.weights: checkpoint '"),
        (dict(processing_class=other_chat_template), "tokenizer: checkpoint '"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_a_resume_that_changes_the_math_is_refused_naming_the_field(old_run, tmp_path, change, expected):
    change = {key: value() if callable(value) else value for key, value in change.items()}
    if "processing_class" in change:
        trainer = RLOOTrainer(
            model=toy_model_path(),
            args=make_config(tmp_path, max_steps=6, save_steps=2),
            train_dataset=toy_dataset(),
            reward_funcs=[letters_reward],
            **change,
        )
    else:
        trainer = make_trainer(tmp_path, max_steps=6, save_steps=2, **change)
    with pytest.raises(CheckpointError, match=f"cannot resume from .*checkpoint-4: [12] setting.*{expected}"):
        trainer.train(resume_from_checkpoint=str(old_run / "checkpoint-4"))
    assert trainer.state.global_step == 0


def test_settings_that_do_not_change_training_may_change_and_are_logged(old_run, tmp_path, caplog):
    run = copy_run(old_run, tmp_path)
    trainer = make_trainer(run, max_steps=6, save_steps=3, save_total_limit=3, logging_steps=2, report_to="none")
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6
    assert "with changed settings: " in caplog.text and "not what an update computes" in caplog.text
    assert "max_steps 4 -> 6" in caplog.text and "save_steps 2 -> 3" in caplog.text
    # the linear schedule is rebuilt for 6 steps (warmup 2): step 4 trains at 1e-3 x (6 - 4) / (6 - 2), and the
    # resume says so, with the old schedule's rate (0: it ended at step 4) and the setting that keeps it
    assert (
        "Resuming at step 4 with 4 -> 6 total steps changes the learning-rate schedule (linear, warmup 2 -> 2 "
        "steps): at step 4 the learning rate is 0.0005, where the schedule of the run that wrote the checkpoint "
        "gives 0. "
    ) in caplog.text and "resume with max_steps=4." in caplog.text
    # steps 5 and 6 train at 5e-4 and 2.5e-4 (logged as their mean); the first resumed step too, not at the rate the
    # loaded optimizer held (the old schedule's 0)
    assert step_entries(trainer.state.log_history)[-1]["step"] == 6
    assert step_entries(trainer.state.log_history)[-1]["learning_rate"] == pytest.approx((5e-4 + 2.5e-4) / 2)


def test_low_precision_weights_without_master_copies_are_refused_unless_allowed(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path(), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"model's trainable parameters are torch.bfloat16.*allow_low_precision"):
        make_trainer(tmp_path, model=model)
    trainer = make_trainer(tmp_path, model=model, allow_low_precision_weights=True, max_steps=1, save_steps=1)
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    # A model given by name loads in float32 (from_pretrained's "auto" would give the checkpoint's bf16) ...
    bf16_dir = tmp_path / "bf16-model"
    model.save_pretrained(bf16_dir)
    AutoTokenizer.from_pretrained(toy_model_path()).save_pretrained(bf16_dir)
    trainer = make_trainer(tmp_path / "a", model=str(bf16_dir))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    # ... unless model_init_kwargs asks for a dtype
    with pytest.raises(ValueError, match="torch.bfloat16"):
        make_trainer(tmp_path / "b", model=str(bf16_dir), model_init_kwargs={"dtype": "bfloat16"})


def test_deepspeed_mixed_precision_keeps_master_weights():
    from steadyrl.models.loading import mixed_precision_engine

    args = make_config("unused", bf16=False)
    assert mixed_precision_engine({"bf16": {"enabled": True}}, args)
    assert not mixed_precision_engine({"bf16": {"enabled": "auto"}}, args)  # auto follows bf16=False
    assert not mixed_precision_engine({"zero_optimization": {"stage": 2}}, args)
    assert not mixed_precision_engine(None, args)


def test_reward_functions_are_identified_by_name_not_address():
    from steadyrl.checkpoint.fingerprint import callable_identity

    assert callable_identity(letters_reward) == "steadyrl.toy.task.letters_reward"


def test_a_complete_checkpoint_killed_before_its_rename_is_promoted_at_the_next_start(old_run, tmp_path, caplog):
    run = copy_run(old_run, tmp_path)
    (run / "checkpoint-4").rename(run / "tmp-checkpoint-4")  # the manifest was written, the rename never happened
    trainer = make_trainer(run, max_steps=5, save_steps=2, save_total_limit=2)
    trainer.train(resume_from_checkpoint=True)
    assert "Promoted" in caplog.text and "tmp-checkpoint-4" in caplog.text
    assert [entry["step"] for entry in step_entries(trainer.state.log_history)] == [
        1,
        2,
        3,
        4,
        5,
    ]  # resumed from step 4
    assert names(run) == ["checkpoint-2", "checkpoint-4"]
