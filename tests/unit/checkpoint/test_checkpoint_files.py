"""Checkpoint directories on a tmp dir, with made-up contents: the manifest a commit writes and what verification
refuses, the scan, rotation and recovery of a commit cut short. The same on real runs:
tests/integration/resume/test_manifest.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steadyrl.checkpoint import (
    CheckpointError,
    begin_checkpoint,
    commit_checkpoint,
    recover_interrupted_commits,
    rotate_checkpoints,
    scan_checkpoints,
    verify_checkpoint,
    write_manifest,
)

# what a steadyrl checkpoint of one process must hold (manifest.REQUIRED_FILES), with made-up contents
ONE_PROCESS = (
    "trainer_state.json",
    "steadyrl_state.json",
    "scheduler.pt",
    "optimizer.pt",
    "rng_state_0.json",
    "meter_0.json",
    "model.safetensors",
)


def fill(directory: Path, names=ONE_PROCESS) -> Path:
    for name in names:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(f"contents of {name}".encode())
    return directory


def committed(output_dir: Path, step: int) -> Path:
    return commit_checkpoint(fill(begin_checkpoint(output_dir, step)), step, processes=1)


def test_a_commit_lists_every_file_with_its_size_and_hash_then_renames(tmp_path):
    final = committed(tmp_path, 3)
    assert final == tmp_path / "checkpoint-3" and not (tmp_path / "tmp-checkpoint-3").exists()
    manifest = verify_checkpoint(final)
    assert (manifest["global_step"], manifest["layout"], manifest["processes"]) == (3, "steadyrl", 1)
    assert sorted(manifest["files"]) == sorted(ONE_PROCESS)
    assert manifest["files"]["scheduler.pt"]["size"] == len(b"contents of scheduler.pt")


def flip_a_byte(checkpoint: Path) -> None:
    data = bytearray((checkpoint / "optimizer.pt").read_bytes())
    data[0] ^= 1
    (checkpoint / "optimizer.pt").write_bytes(bytes(data))


DAMAGE = {  # what is done to a complete checkpoint-3, and the start of what verification says
    "flipped byte": (flip_a_byte, "file optimizer.pt does not match its sha256"),
    "truncated": (lambda c: (c / "scheduler.pt").write_bytes(b"x"), "file scheduler.pt has 1 bytes"),
    "missing": (lambda c: (c / "rng_state_0.json").unlink(), "file rng_state_0.json listed in the manifest is missing"),
    "unlisted": (lambda c: (c / "extra.bin").write_bytes(b"?"), "file extra.bin is not listed in the manifest"),
    "symlink": (lambda c: (c / "link").symlink_to(c / "scheduler.pt"), "link is a symlink"),
    "no manifest": (lambda c: (c / "manifest.json").unlink(), "has no manifest.json"),
    "bad json": (lambda c: (c / "manifest.json").write_text("{"), "is not valid JSON"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_verification_names_each_damage(tmp_path, damage):
    checkpoint = committed(tmp_path, 3)
    edit, message = DAMAGE[damage]
    edit(checkpoint)
    with pytest.raises(CheckpointError, match=message):
        verify_checkpoint(checkpoint)


def test_a_quick_verification_checks_sizes_but_reads_no_content(tmp_path):
    checkpoint = committed(tmp_path, 3)
    flip_a_byte(checkpoint)
    assert verify_checkpoint(checkpoint, hashes=False)["global_step"] == 3


def test_a_manifest_is_refused_when_a_required_file_or_a_process_is_missing(tmp_path):
    without_scheduler = fill(tmp_path / "checkpoint-1", [n for n in ONE_PROCESS if n != "scheduler.pt"])
    with pytest.raises(CheckpointError, match="does not list scheduler.pt, which a steadyrl checkpoint holds"):
        write_manifest(without_scheduler, 1)
    one_of_two = fill(tmp_path / "checkpoint-2")
    with pytest.raises(CheckpointError, match=r"files of 2 processes but no meter file of process\(es\) \[1\]"):
        write_manifest(one_of_two, 2, processes=2)
    assert not (one_of_two / "manifest.json").exists(), "a refused directory gets no manifest"
    renamed = committed(tmp_path, 5).rename(tmp_path / "checkpoint-6")
    with pytest.raises(CheckpointError, match="says global_step 5, but the directory is named checkpoint-6"):
        verify_checkpoint(renamed)


@pytest.mark.parametrize("weights", ["model.safetensors", "adapter_model.safetensors", "actor/model.safetensors"])
def test_the_actors_weights_are_required_in_either_layout(tmp_path, weights):
    """At the top level (a full actor or a PEFT one's adapter), or under actor/ (checkpoints of earlier versions)."""
    others = [name for name in ONE_PROCESS if name != "model.safetensors"]
    write_manifest(fill(tmp_path / "checkpoint-1", [*others, weights]), 1)
    without = fill(tmp_path / "checkpoint-2", [*others, "config.json", "actor.txt"])
    with pytest.raises(CheckpointError, match=r"does not list the actor's weights \(model.safetensors or adapter_"):
        write_manifest(without, 2)


def test_a_plain_trainer_checkpoint_needs_only_its_trainer_state(tmp_path):
    checkpoint = fill(tmp_path / "checkpoint-2", ["trainer_state.json", "model.safetensors"])
    write_manifest(checkpoint, 2)
    assert verify_checkpoint(checkpoint)["layout"] == "transformers"


def test_the_scan_sorts_complete_checkpoints_and_gives_each_rejection_a_reason(tmp_path):
    for step in (10, 2):
        committed(tmp_path, step)
    fill(begin_checkpoint(tmp_path, 12))  # a save cut short before its manifest
    damaged = committed(tmp_path, 11)
    (damaged / "scheduler.pt").write_bytes(b"")
    (tmp_path / "checkpoint-notes").mkdir()  # not a checkpoint name: ignored
    scan = scan_checkpoints(tmp_path)
    assert [step for step, _ in scan.complete] == [2, 10] and scan.newest == tmp_path / "checkpoint-10"
    reasons = dict(scan.rejected)
    assert set(reasons) == {damaged, tmp_path / "tmp-checkpoint-12"}
    assert "scheduler.pt has 0 bytes" in reasons[damaged]
    assert reasons[tmp_path / "tmp-checkpoint-12"].startswith("incomplete")


def test_rotation_deletes_the_oldest_beyond_the_limit_and_never_the_newest(tmp_path):
    for step in (1, 2, 3):
        committed(tmp_path, step)
    assert rotate_checkpoints(tmp_path, 2) == [tmp_path / "checkpoint-1"]
    assert rotate_checkpoints(tmp_path, None) == [] and rotate_checkpoints(tmp_path, 0) == []
    assert rotate_checkpoints(tmp_path, 1) == [tmp_path / "checkpoint-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]


def test_recovery_promotes_a_complete_tmp_and_leaves_an_incomplete_one(tmp_path):
    complete = fill(begin_checkpoint(tmp_path, 4))
    write_manifest(complete, 4, layout="steadyrl", processes=1)  # the crash fell between manifest and rename
    fill(begin_checkpoint(tmp_path, 8))
    (tmp_path / "deleting-checkpoint-1").mkdir()  # a rotation cut short
    done = recover_interrupted_commits(tmp_path)
    assert len(done) == 2 and done[0].startswith("Promoted") and "deleting-checkpoint-1" in done[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "tmp-checkpoint-8"]
    assert json.loads((tmp_path / "checkpoint-4" / "manifest.json").read_text())["global_step"] == 4
