"""TR-DPO's reference syncing (``sync_ref_model``): the reference follows TRL's SyncRefModelCallback exactly, lives in
every checkpoint, resumes byte-identically, and is refused where there is no reference of its own to update."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TWO_PROCESSES, ZERO, read_logs, run_toy
from safetensors.torch import load_file
from support.toy_run import make_config, make_trainer

from steadyrl.checkpoint import CheckpointError, verify_checkpoint
from steadyrl.checkpoint.files import write_manifest
from steadyrl.toy import toy_model_path

ALPHA, EVERY = 0.5, 2
# save every 2 steps: each checkpoint holds the actor and the reference of a sync step (2 and 6 fall mid-rollout)
SYNC = {
    "sync_ref_model": True,
    "ref_model_sync_steps": EVERY,
    "ref_model_mixup_alpha": ALPHA,
    "save_steps": 2,
    "ref_reward_offload": True,
}
SYNC_FLAGS = ["--set", *(f"{key}={json.dumps(value)}" for key, value in SYNC.items())]
# under ZeRO-3: two processes, each with its share of the rollout (one --set: a second would replace the first)
ZERO3_FLAGS = [*TWO_PROCESSES, *SYNC_FLAGS[1:], "max_steps=8"]


@pytest.fixture(scope="module")
def synced(tmp_path_factory, toy_path) -> Path:
    """The output dir of one uninterrupted 12-step RLOO run with sync (checked several ways: do not modify it)."""
    out = tmp_path_factory.mktemp("synced")
    run_toy(out, *SYNC_FLAGS)
    return out


def weights(checkpoint: Path, name: str) -> dict[str, torch.Tensor]:
    """A checkpoint's weights of the actor (at its top level) or the reference (under reference/)."""
    return load_file(checkpoint / ("" if name == "actor" else name) / "model.safetensors")


def assert_trls_mix_at_each_sync_step(output_dir: Path, last_step: int) -> None:
    """Each checkpoint's reference is alpha x its actor + (1 - alpha) x the previous checkpoint's reference, computed
    here with TRL's operations, bit for bit; the first one mixes with the initial actor."""
    reference = load_file(Path(toy_model_path()) / "model.safetensors")
    for step in range(EVERY, last_step + 1, EVERY):
        checkpoint = output_dir / f"checkpoint-{step}"
        actor = weights(checkpoint, "actor")
        expected = {name: ref.clone().mul_(1 - ALPHA).add_(actor[name], alpha=ALPHA) for name, ref in reference.items()}
        saved = weights(checkpoint, "reference")
        assert saved.keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(saved[name], tensor), f"step {step}: reference {name} is not the mix"
        assert any(not torch.equal(saved[name], reference[name]) for name in saved), f"step {step}: not synced"
        reference = saved
    assert any(not torch.equal(reference[name], actor[name]) for name in actor), "alpha 0.5 is not a copy"


def assert_same_run(resumed: Path, uninterrupted: Path, after_step: int, last_step: int) -> None:
    """The resumed run's final actor, last reference and logged metrics after ``after_step`` are the uninterrupted
    run's, byte for byte."""
    for name in ("final-actor/model.safetensors", f"checkpoint-{last_step}/reference/model.safetensors"):
        assert (resumed / name).read_bytes() == (uninterrupted / name).read_bytes(), f"{name} differs"
    new_logs, logs = read_logs(resumed), read_logs(uninterrupted)
    assert sorted(new_logs) == sorted(logs) == list(range(1, last_step + 1))
    for step in range(after_step + 1, last_step + 1):
        for key in set(logs[step]) - {"tokens_per_second"}:
            assert new_logs[step][key] == logs[step][key], f"step {step}: {key} differs"


def test_the_reference_is_trls_mix_of_the_policy_at_each_sync_step(synced):
    assert_trls_mix_at_each_sync_step(synced, last_step=12)


def test_the_reference_is_listed_in_the_manifest(synced):
    manifest = verify_checkpoint(synced / "checkpoint-6")
    assert {"reference/model.safetensors", "reference/config.json"} <= set(manifest["files"])


def test_a_run_killed_after_a_checkpoint_resumes_with_identical_actor_and_reference(synced, tmp_path):
    run_toy(tmp_path, *SYNC_FLAGS, "--kill-after-save", "6", expect_kill=True)
    assert (tmp_path / "checkpoint-6" / "rollout_buffer_0.safetensors").is_file(), "save at 6 is mid-rollout"
    _, output = run_toy(tmp_path, *SYNC_FLAGS, "--resume")
    assert "Resuming from" in output and "checkpoint-6" in output
    assert_same_run(tmp_path, synced, after_step=6, last_step=12)


def test_under_zero3_the_mix_is_exact_and_a_killed_run_resumes_identically(tmp_path):
    """Two processes under DeepSpeed ZeRO-3: the policy and the reference (an inference engine, offloaded to CPU
    memory) are partitioned; the mix gathers them layer by layer."""
    uninterrupted, run = tmp_path / "uninterrupted", tmp_path / "run"
    run_toy(uninterrupted, *ZERO3_FLAGS, accelerate_config=ZERO["zero3"])
    assert_trls_mix_at_each_sync_step(uninterrupted, last_step=8)
    run_toy(run, *ZERO3_FLAGS, "--kill-after-save", "6", expect_kill=True, accelerate_config=ZERO["zero3"])
    _, output = run_toy(run, *ZERO3_FLAGS, "--resume", accelerate_config=ZERO["zero3"])
    assert output.count("Resuming from") == 2 and "checkpoint-6" in output
    assert_same_run(run, uninterrupted, after_step=6, last_step=8)


def test_resuming_with_other_sync_settings_is_refused(synced, tmp_path):
    shutil.copytree(synced / "checkpoint-6", tmp_path / "checkpoint-6")
    trainer = make_trainer(tmp_path, **{**SYNC, "ref_model_mixup_alpha": 0.6})
    with pytest.raises(CheckpointError, match="ref_model_mixup_alpha: checkpoint 0.5, now 0.6"):
        trainer.train(resume_from_checkpoint=True)


def test_a_checkpoint_without_its_reference_is_refused(synced, tmp_path):
    checkpoint = shutil.copytree(synced / "checkpoint-6", tmp_path / "checkpoint-6")
    shutil.rmtree(checkpoint / "reference")
    write_manifest(checkpoint, 6)
    trainer = make_trainer(tmp_path, **SYNC)
    with pytest.raises(CheckpointError, match="has no reference/ directory, which every checkpoint of this run holds"):
        trainer.train(resume_from_checkpoint=True)


@pytest.mark.parametrize("algorithm", ["rloo", "ppo", "online-dpo"])
def test_alpha_one_makes_the_reference_a_copy_of_the_policy_in_every_trainer(tmp_path, algorithm):
    trainer = make_trainer(
        tmp_path,
        algorithm=algorithm,
        max_steps=3,
        save_strategy="no",
        sync_ref_model=True,
        ref_model_sync_steps=3,
        ref_model_mixup_alpha=1.0,
    )
    trainer.train()
    policy, reference = trainer.model.state_dict(), trainer.ref_model.state_dict()
    assert all(torch.equal(reference[name], tensor) for name, tensor in policy.items())
    initial = load_file(Path(toy_model_path()) / "model.safetensors")
    assert any(not torch.equal(policy[name], tensor) for name, tensor in initial.items()), "the policy did not move"


def test_without_sync_the_reference_stays_the_initial_actor_and_is_not_checkpointed(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, save_steps=2, ref_model_sync_steps=1, ref_model_mixup_alpha=1.0)
    trainer.train()
    initial = load_file(Path(toy_model_path()) / "model.safetensors")
    reference = trainer.ref_model.state_dict()
    assert all(torch.equal(reference[name], tensor) for name, tensor in initial.items())
    assert any(not torch.equal(trainer.model.state_dict()[name], tensor) for name, tensor in initial.items())
    assert not (tmp_path / "checkpoint-2" / "reference").exists()


# ---- refusals -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(ref_model_mixup_alpha=1.5), r"ref_model_mixup_alpha=1.5 is invalid: .* a number in \[0, 1\]\.$"),
        (dict(ref_model_mixup_alpha=-0.1), r"ref_model_mixup_alpha=-0.1 is invalid"),
        (dict(ref_model_mixup_alpha=math.nan), r"ref_model_mixup_alpha=nan is invalid"),
        (dict(ref_model_sync_steps=0), r"ref_model_sync_steps=0 is invalid: .* an integer >= 1\.$"),
        (dict(ref_model_sync_steps=2.5), r"ref_model_sync_steps=2.5 is invalid"),
        (dict(ref_model_sync_steps=True), r"ref_model_sync_steps=True is invalid"),
        (dict(sync_ref_model="yes"), r"sync_ref_model='yes' is invalid: it must be True or False\.$"),
    ],
)
@pytest.mark.parametrize("algorithm", ["rloo", "ppo", "online-dpo"])
def test_invalid_sync_settings_are_refused_naming_the_value(tmp_path, algorithm, settings, message):
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, algorithm, **settings)


def test_the_bounds_are_valid(tmp_path):
    for alpha in (0, 1.0):
        assert make_config(tmp_path, ref_model_mixup_alpha=alpha, ref_model_sync_steps=1).ref_model_mixup_alpha == alpha


def test_sync_under_peft_is_refused_when_the_trainer_is_built(tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    with pytest.raises(ValueError, match=r"^sync_ref_model=True is not supported with peft_config: under PEFT"):
        make_trainer(tmp_path, peft_config=lora, sync_ref_model=True)


def test_sync_without_a_reference_model_is_refused(tmp_path):
    """beta=0 leaves no KL term, so no reference copy is made: there is nothing to sync."""
    with pytest.raises(ValueError, match=r"^sync_ref_model=True needs a reference model to update, and with beta=0"):
        make_trainer(tmp_path, sync_ref_model=True, beta=0.0)
