"""RLOO, PPO and online DPO (and distillation and REINFORCE++, killed after a mid-rollout checkpoint): a run
SIGKILLed at any point resumes to the byte-identical result of an uninterrupted run; damaged checkpoints and changed
configurations are refused."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import read_logs, run_toy, step_entries
from support.old_layout import to_old_layout

from steadyrl.checkpoint import CheckpointError, find_resumable_checkpoint, scan_checkpoints, verify_checkpoint
from steadyrl.checkpoint.layout import actor_files

# toy_run defaults: 4 optimizer steps per rollout (2 PPO epochs x 2 mini-batches), save_steps=3, max_steps=12,
# gradient accumulation 2: checkpoints 3, 6 and 9 all fall in the middle of a rollout.
TIMINGS = {"tokens_per_second"}


@pytest.fixture(scope="module", params=["rloo", "ppo", "online-dpo"])
def algorithm(request):
    return request.param


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run, algorithm):
    return uninterrupted_run(algorithm)


def assert_same_result(reference: Path, resumed: Path, after_step: int) -> None:
    ref_bytes = (reference / "final-actor" / "model.safetensors").read_bytes()
    assert (resumed / "final-actor" / "model.safetensors").read_bytes() == ref_bytes, "final actor weights differ"
    ref_logs, new_logs = read_logs(reference), read_logs(resumed)
    assert sorted(new_logs) == sorted(ref_logs) == list(range(1, 13))
    for step in range(after_step + 1, 13):
        assert set(new_logs[step]) == set(ref_logs[step])
        for key in set(ref_logs[step]) - TIMINGS:
            assert new_logs[step][key] == ref_logs[step][key], f"step {step}: {key} differs"


def assert_trains_as(reference, resumed, after_step: int) -> None:
    """The resumed run logged the same rewards as ``reference`` (the same completions; a mean over 8 samples in
    float32, taken over another number of processes, may differ in its last bit), its losses and final weights within
    float tolerance (reductions over another number of processes round differently), and saved at the same steps.
    Not the attention's key biases: a key bias adds the same q.b to every score of a query, which the softmax
    ignores, so their gradient is 0 but for rounding noise, which Adam scales up to learning-rate-sized steps."""
    from safetensors.torch import load_file

    def saved_after(run):
        steps = (int(path.name.split("-")[1]) for path in run.glob("checkpoint-*"))
        return sorted(step for step in steps if step > after_step)

    assert saved_after(resumed) == saved_after(reference)
    ours, theirs = (load_file(run / "final-actor" / "model.safetensors") for run in (resumed, reference))
    for name, tensor in theirs.items():
        if not name.endswith("k_proj.bias"):
            assert (ours[name] - tensor).abs().max() <= 1e-5 * tensor.abs().max().clamp(min=1e-12), name
    new, old = read_logs(resumed), read_logs(reference)
    assert sorted(new) == sorted(old) == list(range(1, 13))
    for step in range(after_step + 1, 13):
        assert new[step]["reward"] == pytest.approx(old[step]["reward"], rel=1e-6), step
        assert new[step]["loss"] == pytest.approx(old[step]["loss"], rel=1e-4, abs=1e-6), step


def run_summary(output_dir: Path) -> dict:
    """The end-of-run summary: metrics.jsonl's last entry."""
    return json.loads((output_dir / "metrics.jsonl").read_text().splitlines()[-1])


def assert_summary_covers_whole_run(reference: Path, resumed: Path) -> None:
    ref, new = run_summary(reference), run_summary(resumed)
    assert new["train_loss"] == ref["train_loss"], "train_loss is not the mean over the whole run"
    for summary in (ref, new):  # 12 steps of 4 samples, over the time of the whole run
        assert summary["train_samples_per_second"] * summary["train_runtime"] == pytest.approx(48)
        assert summary["train_steps_per_second"] * summary["train_runtime"] == pytest.approx(12)


# For PPO and online DPO, tests/integration/resume/test_reliability.py's crash fuzzing kills at random moments, inside
# saves too.
@pytest.mark.parametrize("algorithm", ["rloo", "distillation", "reinforce-pp"], indirect=True)
def test_sigkill_after_mid_rollout_checkpoint_resumes_identically(uninterrupted, tmp_path, algorithm):
    run_toy(tmp_path, "--algorithm", algorithm, "--kill-after-save", "6", expect_kill=True)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert (tmp_path / "checkpoint-6" / "rollout_buffer_0.safetensors").is_file(), "save at 6 is mid-rollout"
    _, output = run_toy(tmp_path, "--algorithm", algorithm, "--resume")
    assert "Resuming from" in output and "checkpoint-6" in output
    assert_same_result(uninterrupted, tmp_path, after_step=6)
    assert_summary_covers_whole_run(uninterrupted, tmp_path)
    before = json.loads((tmp_path / "checkpoint-6" / "meter_0.json").read_text())
    assert run_summary(tmp_path)["train_runtime"] > before["elapsed"] > 0  # the time before the kill counts too


@pytest.mark.parametrize("algorithm", ["rloo"], indirect=True)
def test_sigkill_during_checkpoint_write_falls_back_and_resumes_identically(uninterrupted, tmp_path, algorithm):
    run_toy(tmp_path, "--algorithm", algorithm, "--kill-during-save", "9", expect_kill=True)
    assert (tmp_path / "tmp-checkpoint-9").is_dir() and not (tmp_path / "checkpoint-9").exists()
    _, output = run_toy(tmp_path, "--algorithm", algorithm, "--resume")
    assert "tmp-checkpoint-9" in output and "incomplete" in output, output[-2000:]
    assert "Resuming from" in output and "checkpoint-6" in output
    assert not (tmp_path / "tmp-checkpoint-9").exists()
    assert_same_result(uninterrupted, tmp_path, after_step=6)


@pytest.mark.parametrize("algorithm", ["ppo"], indirect=True)
def test_a_checkpoint_of_the_earlier_layout_resumes_identically(uninterrupted, tmp_path, algorithm):
    """A mid-rollout checkpoint as an earlier steadyrl wrote it (the actor under actor/, support/old_layout.py; PPO's
    critic under critic/, as now) resumes to the uninterrupted run's weights and logs."""
    old = to_old_layout(shutil.copytree(uninterrupted / "checkpoint-9", tmp_path / "checkpoint-9"))
    assert (old / "actor" / "model.safetensors").is_file() and not (old / "model.safetensors").exists()
    _, output = run_toy(tmp_path, "--algorithm", algorithm, "--resume")
    assert "Resuming from" in output and "checkpoint-9" in output
    assert_same_result(uninterrupted, tmp_path, after_step=9)
    assert (tmp_path / "checkpoint-12" / "model.safetensors").read_bytes() == (
        uninterrupted / "checkpoint-12" / "model.safetensors"
    ).read_bytes()


def checkpoint_files(checkpoint: Path) -> list[str]:
    return sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file())


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_any_damaged_file_is_refused(uninterrupted, tmp_path, damage, algorithm):
    files = checkpoint_files(uninterrupted / "checkpoint-12")
    expected = {"manifest.json", "optimizer.pt", "scheduler.pt", "model.safetensors", "rng_state_0.json"}
    if algorithm == "ppo":
        expected |= {"critic/model.safetensors", "critic/config.json", "critic_optimizer.pt", "critic_scheduler.pt"}
    assert expected <= set(files)
    # the actor's files at the top level are exactly what save_model writes (+ the weights index vLLM needs)
    saved = {p.name for p in (uninterrupted / "final-actor").iterdir()}
    assert set(actor_files(files)) == saved | {"model.safetensors.index.json"}
    for name in files:
        run = tmp_path / name.replace("/", "_")
        for step in (9, 12):
            shutil.copytree(uninterrupted / f"checkpoint-{step}", run / f"checkpoint-{step}")
        target = run / "checkpoint-12" / name
        if damage == "delete":
            target.unlink()
        else:
            target.write_bytes(target.read_bytes()[: max(0, target.stat().st_size // 2)])
        scan = scan_checkpoints(run)
        assert [step for step, _ in scan.complete] == [9], f"damaged {name} was accepted"
        assert find_resumable_checkpoint(run) == run / "checkpoint-9"
        with pytest.raises(CheckpointError) as err:
            verify_checkpoint(run / "checkpoint-12")
        assert "manifest" in str(err.value) and (name in str(err.value) or name == "manifest.json")
        shutil.rmtree(run)  # one copy of two checkpoints per file would take gigabytes


def test_explicit_damaged_checkpoint_stops_with_error_naming_file(uninterrupted, tmp_path, algorithm):
    from support.toy_run import make_trainer

    damaged = "critic_optimizer.pt" if algorithm == "ppo" else "optimizer.pt"
    shutil.copytree(uninterrupted / "checkpoint-9", tmp_path / "checkpoint-9")
    (tmp_path / "checkpoint-9" / damaged).write_bytes(b"")
    trainer = make_trainer(tmp_path, algorithm=algorithm)
    with pytest.raises(CheckpointError, match=damaged):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-9"))
    assert trainer.state.global_step == 0


def test_resume_with_changed_batch_hierarchy_is_refused_before_any_step(uninterrupted, tmp_path, algorithm):
    from support.toy_run import make_trainer

    shutil.copytree(uninterrupted / "checkpoint-6", tmp_path / "checkpoint-6")
    trainer = make_trainer(tmp_path, algorithm=algorithm, train_batch_size=8, micro_train_batch_size=4)
    with pytest.raises(CheckpointError, match="train_batch_size: checkpoint 4, now 8"):
        trainer.train(resume_from_checkpoint=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-6"]


def test_resume_from_config_field_and_fresh_start(uninterrupted, tmp_path, caplog, algorithm):
    from support.toy_run import make_trainer

    fresh = make_trainer(tmp_path / "empty", algorithm=algorithm, resume_from_checkpoint="true", max_steps=1)
    fresh.train()
    assert fresh.state.global_step == 1
    assert "No complete checkpoint" in caplog.text and "starting from step 0" in caplog.text

    shutil.copytree(uninterrupted / "checkpoint-9", tmp_path / "run" / "checkpoint-9")
    trainer = make_trainer(tmp_path / "run", algorithm=algorithm, resume_from_checkpoint="true", max_steps=10)
    trainer.train()
    steps = [entry["step"] for entry in step_entries(trainer.state.log_history)]
    assert steps == list(range(1, 11)), "the config field resume_from_checkpoint was not honoured"


def test_the_model_card_lists_metrics_the_trainer_logs(uninterrupted, algorithm):
    from steadyrl.publish.hub import final_metrics

    card = final_metrics(list(read_logs(uninterrupted).values()))
    own = {"rloo": {"rlhf_reward"}, "ppo": {"rlhf_reward", "score"}, "online-dpo": {"rewards/accuracies"}}
    assert set(card) == {"reward", "reward_std", "kl", "loss"} | own[algorithm], card


@pytest.mark.parametrize("algorithm", ["rloo"], indirect=True)
def test_a_checkpoint_of_the_previous_state_format_is_refused_naming_it(uninterrupted, tmp_path, algorithm):
    """Format 3 (before the loop's state became registered parts) is refused before any step, naming both formats."""
    from support.toy_run import make_trainer

    from steadyrl.checkpoint import CheckpointError
    from steadyrl.checkpoint.files import write_manifest

    checkpoint = tmp_path / "checkpoint-6"
    shutil.copytree(uninterrupted / "checkpoint-6", checkpoint)
    state = checkpoint / "steadyrl_state.json"
    state.write_text(state.read_text().replace('"format": 5', '"format": 3'))
    write_manifest(checkpoint, 6)
    trainer = make_trainer(tmp_path, algorithm=algorithm)
    with pytest.raises(CheckpointError, match=r"state format 3; this version reads format 4, 5 only"):
        trainer.train(resume_from_checkpoint=True)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-6"], "no step ran"
