"""Exporting a checkpoint's actor (steadyrl/publish/export.py) from a checkpoint directory made here: the toy model's
own files next to steadyrl's state files and a critic. Only the actor's files are copied, byte for byte, and load
with from_pretrained; an output directory given for a checkpoint, or a non-empty export directory, is refused. From
trained runs (LoRA merge, old layouts, vLLM): tests/integration/publish/test_export.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from steadyrl.checkpoint import CheckpointError, begin_checkpoint, commit_checkpoint
from steadyrl.checkpoint.layout import index_single_file
from steadyrl.publish.export import export_actor

STATE_FILES = ("trainer_state.json", "steadyrl_state.json", "scheduler.pt", "optimizer.pt", "rng_state_0.json")


def checkpoint_of(model_path: str, output_dir: Path, step: int) -> Path:
    """A committed checkpoint holding the model at ``model_path`` as its actor, steadyrl's state files and a critic."""
    tmp = begin_checkpoint(output_dir, step)
    shutil.copytree(model_path, tmp, dirs_exist_ok=True)
    index_single_file(tmp)  # as a checkpoint keeps for vLLM
    for name in STATE_FILES:
        (tmp / name).write_text("{}")
    (tmp / "critic").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(model_path) / name, tmp / "critic" / name)
    return commit_checkpoint(tmp, step, processes=1)


def test_export_copies_the_actors_files_alone_and_they_load(toy_path, tmp_path):
    checkpoint = checkpoint_of(toy_path, tmp_path / "run", 4)
    out = export_actor(checkpoint, tmp_path / "actor")
    exported = sorted(p.name for p in out.iterdir())
    assert exported == sorted(p.name for p in Path(toy_path).iterdir()), "no state file, critic or index"
    for name in exported:
        assert (out / name).read_bytes() == (Path(toy_path) / name).read_bytes(), name
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == AutoModelForCausalLM.from_pretrained(toy_path).config.vocab_size


def test_an_output_directory_or_a_used_export_directory_is_refused(toy_path, tmp_path):
    run = tmp_path / "run"
    for step in (2, 10):
        checkpoint_of(toy_path, run, step)
    with pytest.raises(
        CheckpointError, match=r"is an output directory, not a checkpoint: give one, e\.g\. .*checkpoint-10"
    ):
        export_actor(run, tmp_path / "actor")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="used exists and is not empty"):
        export_actor(run / "checkpoint-2", tmp_path / "used")
    assert sorted(p.name for p in (tmp_path / "used").iterdir()) == ["notes.txt"]
