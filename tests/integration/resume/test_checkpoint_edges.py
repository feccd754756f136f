"""Edges of the checkpoint package: a run without checkpoints is not started over by accident, a failed save names
what stands without hashing it, the lock never writes through a link, a replaced checkpoint-N survives a failed or
interrupted rename, a plain Trainer's re-save gets a new manifest, and a failure on the main process alone reaches
every process."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_entries
from support.toy_run import make_trainer

from steadyrl.checkpoint import (
    CheckpointError,
    commit_checkpoint,
    recover_interrupted_commits,
    scan_checkpoints,
    verify_checkpoint,
)
from steadyrl.checkpoint import files as checkpoint_files
from steadyrl.checkpoint import manifest as checkpoint_manifest
from steadyrl.checkpoint.ownership import LOCK_NAME, OutputDirLock

# ---- a run without checkpoints ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_checkpoints(tmp_path_factory) -> Path:
    """A finished one-step run with save_strategy="no": metrics.jsonl and a saved actor/, no checkpoint."""
    run = tmp_path_factory.mktemp("no-checkpoints")
    trainer = make_trainer(run, max_steps=1, save_strategy="no")
    trainer.train()
    trainer.save_model(str(run / "actor"))
    assert run_entries(run) == ["actor"] and (run / "metrics.jsonl").stat().st_size
    return run


def copy_run(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def test_a_fresh_start_refuses_a_finished_run_without_checkpoints_and_overwrite_replaces_it(no_checkpoints, tmp_path):
    run = copy_run(no_checkpoints, tmp_path)
    metrics = (run / "metrics.jsonl").read_bytes()
    refused = r"holds a run without checkpoints \(metrics.jsonl, actor/\). A fresh start would truncate its logs"
    with pytest.raises(CheckpointError, match=refused):
        make_trainer(run, max_steps=1, save_strategy="no").train()
    with pytest.raises(CheckpointError, match="resume_from_checkpoint=True finds no checkpoint to continue it from"):
        make_trainer(run, max_steps=1, save_strategy="no").train(resume_from_checkpoint=True)
    assert (run / "metrics.jsonl").read_bytes() == metrics and run_entries(run) == ["actor"]

    trainer = make_trainer(run, max_steps=2, save_strategy="no", overwrite_output_dir=True)
    trainer.train()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 2]  # the new run's two steps and its summary, nothing of the old run's


def test_a_saved_actor_alone_is_refused_too(no_checkpoints, tmp_path):
    run = copy_run(no_checkpoints, tmp_path)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(CheckpointError, match=r"holds a run without checkpoints \(actor/\)"):
        make_trainer(run, max_steps=1, save_strategy="no").train()


def test_a_run_stopped_before_its_first_save_is_started_again_by_a_resume_only(no_checkpoints, tmp_path, caplog):
    run = copy_run(no_checkpoints, tmp_path)
    shutil.rmtree(run / "actor")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[0] + "\n")  # killed after logging step 1: no summary line
    with pytest.raises(CheckpointError, match=r"holds a run without checkpoints \(metrics.jsonl\)"):
        make_trainer(run, max_steps=1, save_strategy="no").train()
    make_trainer(run, max_steps=1, save_strategy="no").train(resume_from_checkpoint=True)
    assert "a run stopped before its first checkpoint (metrics.jsonl)" in caplog.text
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2  # step 1 again and the summary


# ---- a failed save ---------------------------------------------------------------------------------------------------


def test_a_failed_save_names_the_intact_checkpoint_without_hashing_it(tmp_path, monkeypatch):
    import torch

    trainer, real_save, real_sha256 = make_trainer(tmp_path, max_steps=6), torch.save, checkpoint_manifest._sha256
    hashed = []

    def save_until_the_disk_fills(obj, path, *args, **kwargs):
        if trainer.state.global_step >= 6:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    def recording_sha256(path):
        hashed.append(Path(path).relative_to(tmp_path).parts[0])
        return real_sha256(path)

    monkeypatch.setattr(torch, "save", save_until_the_disk_fills)
    monkeypatch.setattr(checkpoint_manifest, "_sha256", recording_sha256)
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'checkpoint-3'}, is intact"):
        trainer.train()
    assert set(hashed) == {"tmp-checkpoint-3"}, "only its commit hashes files"


# ---- the lock file ---------------------------------------------------------------------------------------------------


def test_the_lock_never_opens_a_symlink(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("not a lock")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(precious)
    with pytest.raises(CheckpointError, match=rf"holds a {LOCK_NAME} that is a symlink"):
        OutputDirLock(out).acquire()
    assert precious.read_text() == "not a lock"
    (out / LOCK_NAME).unlink()
    (out / LOCK_NAME).mkdir()
    with pytest.raises(CheckpointError, match=rf"holds a {LOCK_NAME} that is not a regular file"):
        OutputDirLock(out).acquire()


# ---- replacing checkpoint-N ------------------------------------------------------------------------------------------

STEADYRL_FILES = (
    "trainer_state.json",
    "steadyrl_state.json",
    "scheduler.pt",
    "optimizer.pt",
    "rng_state_0.json",
    "meter_0.json",
    "model.safetensors",
)


def fill(directory: Path, content: str) -> Path:
    """A directory with a steadyrl checkpoint's files (their content is never read, only hashed)."""
    for name in STEADYRL_FILES:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(f"{content} {name}")
    return directory


@pytest.fixture
def replacing(tmp_path) -> Path:
    """``checkpoint-2`` (old, complete) and a filled ``tmp-checkpoint-2`` (new) about to replace it."""
    commit_checkpoint(fill(tmp_path / "tmp-checkpoint-2", "old"), 2)
    fill(tmp_path / "tmp-checkpoint-2", "new")
    return tmp_path


def content(checkpoint: Path) -> str:
    verify_checkpoint(checkpoint)
    return (checkpoint / "trainer_state.json").read_text().split()[0]


class Crash(BaseException):
    """The process dies here (no handler runs)."""


def failing_rename(monkeypatch, fails: dict[str, BaseException]) -> None:
    """os.rename raises ``fails[source name]`` (once each)."""
    real = os.rename

    def rename(src, dst):
        if (error := fails.pop(Path(src).name, None)) is not None:
            raise error
        return real(src, dst)

    monkeypatch.setattr(checkpoint_files.os, "rename", rename)


def test_a_failed_rename_puts_the_old_checkpoint_back(replacing, monkeypatch):
    failing_rename(monkeypatch, {"tmp-checkpoint-2": OSError(errno.EIO, "Input/output error")})
    with pytest.raises(OSError, match="Input/output error"):
        commit_checkpoint(replacing / "tmp-checkpoint-2", 2)
    assert content(replacing / "checkpoint-2") == "old"
    shutil.rmtree(replacing / "tmp-checkpoint-2")  # what a failed save does next
    assert recover_interrupted_commits(replacing) == []
    assert sorted(p.name for p in replacing.iterdir()) == ["checkpoint-2"] and content(replacing / "checkpoint-2")


@pytest.mark.parametrize("put_back", ["fails", "crashes"])
def test_when_putting_the_old_checkpoint_back_fails_the_next_start_recovers_one(replacing, monkeypatch, put_back):
    """The new copy's rename fails, and so does (or the process dies in) the rename putting the old one back: the
    next start makes a complete checkpoint-2 again, whether the failed save removed the new copy or not."""
    back = OSError(errno.EIO, "Input/output error") if put_back == "fails" else Crash()
    failing_rename(
        monkeypatch, {"tmp-checkpoint-2": OSError(errno.EIO, "Input/output error"), "replaced-checkpoint-2": back}
    )
    with pytest.raises(OSError if put_back == "fails" else Crash):
        commit_checkpoint(replacing / "tmp-checkpoint-2", 2)
    monkeypatch.undo()
    assert not (replacing / "checkpoint-2").exists()
    if put_back == "fails":  # the save goes on to remove its partial directory; a dead process does not
        shutil.rmtree(replacing / "tmp-checkpoint-2")
    done = recover_interrupted_commits(replacing)
    assert sorted(p.name for p in replacing.iterdir()) == ["checkpoint-2"], done
    assert content(replacing / "checkpoint-2") == ("old" if put_back == "fails" else "new")


# ---- a plain transformers.Trainer re-saving checkpoint-N -------------------------------------------------------------


def test_a_plain_trainer_writing_over_a_checkpoint_gets_a_new_manifest(tmp_path, toy_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from steadyrl import CheckpointCallback, GlobalStepCallback

    data = Dataset.from_dict({"input_ids": [[3, 4, 5, 6]] * 8, "labels": [[3, 4, 5, 6]] * 8})
    quiet = dict(per_device_train_batch_size=2, report_to="none", disable_tqdm=True, use_cpu=True)
    for learning_rate in (1e-3, 1e-2):  # the second run writes over the first one's checkpoint-2
        args = TrainingArguments(str(tmp_path), max_steps=2, save_steps=2, learning_rate=learning_rate, **quiet)
        Trainer(
            model=AutoModelForCausalLM.from_pretrained(toy_path),
            args=args,
            train_dataset=data,
            callbacks=[GlobalStepCallback(), CheckpointCallback()],
        ).train()
        manifest = verify_checkpoint(tmp_path / "checkpoint-2")
        assert manifest["layout"] == "transformers"
    assert [step for step, _ in scan_checkpoints(tmp_path).complete] == [2]


# ---- failures on the main process alone ------------------------------------------------------------------------------


def test_a_failed_rotation_stops_the_run_naming_the_complete_checkpoint(tmp_path, monkeypatch):
    from steadyrl.checkpoint import checkpointer as checkpointing

    def failing_rotation(output_dir, limit):
        raise PermissionError(errno.EACCES, "Permission denied", str(Path(output_dir) / "checkpoint-3"))

    monkeypatch.setattr(checkpointing, "rotate_checkpoints", failing_rotation)
    trainer = make_trainer(tmp_path, max_steps=3, save_steps=3, save_total_limit=1)
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint-3 is complete, but deleting the checkpoints beyond "
        r"save_total_limit=1 in .* failed \(PermissionError: .*Permission denied",
    ):
        trainer.train()
    verify_checkpoint(tmp_path / "checkpoint-3")
