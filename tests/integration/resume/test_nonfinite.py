"""No non-finite number reaches the weights, the optimizer state, a weight push or a checkpoint: a step whose loss or
gradient is not finite is skipped and said, a run that keeps producing them stops with its newest checkpoint healthy,
and a resume passes over a checkpoint an earlier version saved with NaN in it. (DDP and ZeRO-2:
tests/integration/distributed.)"""

import json
import logging
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.poison import nonfinite_tensors, poison_gradient
from support.toy_run import make_trainer
from transformers import TrainerCallback

from steadyrl.checkpoint import CheckpointError, write_manifest
from steadyrl.trainers.loop.update_guard import NonFiniteUpdateError


class Snapshots(TrainerCallback):
    """The trained modules' weights, optimizer moments and learning rate at the end of every step."""

    def __init__(self) -> None:
        self.trainer, self.steps = None, {}

    def on_step_end(self, args, state, control, **kwargs):
        self.steps[state.global_step] = {
            module.name: {
                "weights": {n: p.detach().clone() for n, p in module.model.named_parameters() if p.requires_grad},
                "moments": [s["exp_avg"].clone() for s in module.optimizer.state.values()],
                "lr": module.scheduler.get_last_lr()[0],
            }
            for module in self.trainer.trained_modules()
        }


def snapshots(trainer) -> Snapshots:
    callback = Snapshots()
    callback.trainer = trainer
    trainer.add_callback(callback)
    return callback


def assert_unchanged(before: dict, after: dict) -> None:
    assert after["lr"] == before["lr"]
    assert all(torch.equal(after["weights"][n], w) for n, w in before["weights"].items())
    assert all(torch.equal(a, b) for a, b in zip(after["moments"], before["moments"], strict=True))


def assert_changed(before: dict, after: dict) -> None:
    assert not all(torch.equal(after["weights"][n], w) for n, w in before["weights"].items())


def checkpoints(output_dir) -> list[str]:
    return sorted(p.name for p in output_dir.glob("checkpoint-*"))


@pytest.mark.parametrize(
    ("step", "value", "max_grad_norm"), [(4, math.nan, 1.0), (3, math.inf, 0.0)], ids=["nan-at-a-save-step", "inf"]
)
def test_a_non_finite_gradient_skips_its_step_and_the_run_finishes(tmp_path, caplog, step, value, max_grad_norm):
    """A NaN (or inf) gradient element in one step, also a step that saves, with clipping or without: that step
    changes no weight, moment or learning rate, says so once, and every checkpoint holds finite numbers only; the
    reference that sync_ref_model mixes the policy into stays finite too."""
    trainer = make_trainer(
        tmp_path,
        algorithm="grpo",
        max_steps=6,
        save_steps=2,
        sync_ref_model=True,
        ref_model_sync_steps=1,
        max_grad_norm=max_grad_norm,
    )
    poison_gradient(trainer, [step], value=value)
    seen = snapshots(trainer)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert trainer.state.global_step == 6
    assert_unchanged(seen.steps[step - 1]["actor"], seen.steps[step]["actor"])
    assert_changed(seen.steps[step]["actor"], seen.steps[step + 1]["actor"])  # the next step trains again
    said = [r.getMessage() for r in caplog.records if "skipped the update" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"Step {step}: skipped the update of the actor (grad_norm ")
    logged = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    if max_grad_norm:  # logged where it clips, as before
        assert not math.isfinite(logged[step]["grad_norm"]) and math.isfinite(logged[step + 1]["grad_norm"])
    assert logged[step]["nonfinite_skipped_steps"] == 1 and "nonfinite_skipped_steps" not in logged[step - 1]
    assert checkpoints(tmp_path) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    for directory in tmp_path.glob("checkpoint-*"):
        assert (directory / "reference" / "model.safetensors").is_file()
        assert nonfinite_tensors(directory) == [], directory.name


def test_a_nan_loss_skips_its_step_and_stays_out_of_the_logged_loss(tmp_path, caplog):
    """A NaN in the forward pass (the final norm's output) makes the step's loss NaN: the step is skipped for its loss,
    and the logged loss of the steps since the last log leaves it out, as Trainer's logging_nan_inf_filter does."""
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=4, save_steps=4, logging_steps=2)
    poison_gradient(trainer, [3], forward=True)
    seen = snapshots(trainer)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "Step 3: skipped the update of the actor (loss nan)" in caplog.text
    assert_unchanged(seen.steps[2]["actor"], seen.steps[3]["actor"])
    logged = {entry["step"]: entry for entry in trainer.state.log_history if "reward" in entry}
    assert math.isfinite(logged[4]["loss"]) and math.isfinite(trainer.state.log_history[-1]["train_loss"])
    assert nonfinite_tensors(tmp_path / "checkpoint-4") == []


def test_a_run_that_keeps_producing_them_stops_with_its_newest_checkpoint_healthy(tmp_path):
    """Three non-finite steps in a row with max_consecutive_nonfinite_steps=2: the third stops the run before any
    update, naming the steps and the prompts (dataset rows) of their mini-batches; the checkpoint of the skipped step
    4 holds the weights of step 2, and the same command without the fault finishes max_steps from it."""
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=6, save_steps=2, max_consecutive_nonfinite_steps=2)
    poison_gradient(trainer, [3, 4, 5, 6])
    rows = []
    trainer.rollout_builder = recording_prompt_rows(trainer.rollout_builder, rows)
    with pytest.raises(NonFiniteUpdateError) as raised:
        trainer.train()
    message = str(raised.value)
    assert message.startswith("3 global steps in a row had a non-finite loss or gradient")
    for step in (3, 4, 5):
        assert f"step {step}: the actor (grad_norm nan); prompts (dataset rows) [" in message
    named = {
        int(row) for part in message.split("prompts (dataset rows) [")[1:] for row in part.split("]")[0].split(",")
    }
    assert named and named <= {row for rollout in rows for row in rollout}, (named, rows)
    assert trainer.state.global_step == 4 and checkpoints(tmp_path) == ["checkpoint-2", "checkpoint-4"]
    for directory in tmp_path.glob("checkpoint-*"):
        assert nonfinite_tensors(directory) == []
    saved = load_file(tmp_path / "checkpoint-4" / "model.safetensors")
    assert all(torch.equal(saved[n], t) for n, t in load_file(tmp_path / "checkpoint-2" / "model.safetensors").items())

    resumed = make_trainer(tmp_path, algorithm="grpo", max_steps=6, save_steps=2, max_consecutive_nonfinite_steps=2)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6 and nonfinite_tensors(tmp_path / "checkpoint-6") == []


def recording_prompt_rows(passes, rows: list):
    """``passes`` (the trainer's scoring passes), recording each rollout's prompt rows."""

    def record(sampled, scores, metrics):
        rows.append(sampled.prompt_index)
        return passes(sampled, scores, metrics)

    return record


def test_a_ppo_critic_whose_gradient_is_not_finite_is_not_stepped_while_the_actor_is(tmp_path, caplog):
    trainer = make_trainer(tmp_path, algorithm="ppo", max_steps=3, save_steps=3)
    poison_gradient(trainer, [2], module="critic")
    seen = snapshots(trainer)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert_unchanged(seen.steps[1]["critic"], seen.steps[2]["critic"])
    assert_changed(seen.steps[1]["actor"], seen.steps[2]["actor"])
    assert "Step 2: skipped the update of the critic (grad_norm nan)" in caplog.text
    assert nonfinite_tensors(tmp_path / "checkpoint-3") == []


def test_a_lora_adapter_whose_gradient_is_not_finite_is_not_stepped(tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=3, save_steps=3, peft_config=lora)
    poison_gradient(trainer, [2])
    seen = snapshots(trainer)
    trainer.train()
    assert all("lora_" in name for name in seen.steps[1]["actor"]["weights"])
    assert_unchanged(seen.steps[1]["actor"], seen.steps[2]["actor"])
    assert nonfinite_tensors(tmp_path / "checkpoint-3") == []


class PoisonWeights(TrainerCallback):
    """At the end of step ``step``, outside the optimizer step, a NaN into one of the actor's weights."""

    def __init__(self, trainer, step: int) -> None:
        self.trainer, self.step = trainer, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                next(self.trainer.model.parameters()).view(-1)[0] = math.nan


def test_the_checkpointer_refuses_weights_that_are_not_finite(tmp_path):
    """Weights made non-finite outside the optimizer step (here a callback) are never saved: the save fails, leaves no
    directory behind, and the newest checkpoint stays the last healthy one."""
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=6, save_steps=2)
    trainer.add_callback(PoisonWeights(trainer, 4))
    with pytest.raises(CheckpointError) as raised:
        trainer.train()
    message = str(raised.value)
    assert message.startswith("Refused to save the actor's weights: model.embed_tokens.weight (1 of ")
    assert f"{tmp_path / 'checkpoint-2'}, is intact" in message
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["checkpoint-2"]


def test_a_checkpoint_an_earlier_version_saved_with_nan_is_passed_over(tmp_path, caplog):
    """An earlier steadyrl saved NaN weights in a complete checkpoint (valid manifest): a resume of the newest passes
    over it, saying so, and trains on from the one before; naming it explicitly is refused."""
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=4, save_steps=2)
    trainer.train()
    poisoned = tmp_path / "checkpoint-4"
    weights = load_file(poisoned / "model.safetensors")
    weights["lm_head.weight" if "lm_head.weight" in weights else "model.norm.weight"][0] = math.nan
    save_file(weights, poisoned / "model.safetensors", metadata={"format": "pt"})
    state = json.loads((poisoned / "steadyrl_state.json").read_text())
    del state["finite_checked"]  # as written before steadyrl checked
    (poisoned / "steadyrl_state.json").write_text(json.dumps(state))
    (poisoned / "manifest.json").unlink()
    write_manifest(poisoned, 4)

    with pytest.raises(CheckpointError, match=r"resume_from_checkpoint=.*checkpoint-4' holds NaN or infinite values"):
        make_trainer(tmp_path, algorithm="grpo", max_steps=6, save_steps=2).train(resume_from_checkpoint=str(poisoned))
    resumed = make_trainer(tmp_path, algorithm="grpo", max_steps=6, save_steps=2)
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=True)
    assert f"Not resuming from {poisoned}: it holds NaN or infinite values (model.safetensors:" in caplog.text
    assert "Resuming from" in caplog.text and str(tmp_path / "checkpoint-2") in caplog.text
    assert resumed.state.global_step == 6
    assert nonfinite_tensors(tmp_path / "checkpoint-4") == [] and nonfinite_tensors(tmp_path / "checkpoint-6") == []
    shutil.rmtree(tmp_path)
