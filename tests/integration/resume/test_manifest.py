"""The strict manifest: every way a checkpoint can be malformed or hold more than its manifest lists makes it damaged
(a CheckpointError naming what is wrong, never a crash of the scan), resume falls back past it, export and push refuse
it; interrupted commits and re-commits are recovered to a complete checkpoint-N."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from support.old_layout import to_old_layout
from support.toy_run import make_trainer

from steadyrl.checkpoint import (
    CheckpointError,
    commit_checkpoint,
    find_resumable_checkpoint,
    recover_interrupted_commits,
    scan_checkpoints,
    verify_checkpoint,
    write_manifest,
)
from steadyrl.checkpoint import files as checkpoint_files
from steadyrl.checkpoint import manifest as checkpoint_manifest
from steadyrl.cli.main import main as steadyrl_main


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, toy_path) -> Path:
    """One tiny real RLOO run with checkpoint-1 and checkpoint-2 (shared by the module: copy it, never modify it)."""
    out = tmp_path_factory.mktemp("manifest-run")
    make_trainer(out, max_steps=2, save_steps=1, disable_tqdm=True).train()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-1", "checkpoint-2"]
    return out


@pytest.fixture
def out(real_run, tmp_path) -> Path:
    """A private output dir: checkpoint-1 (hard links: never modify it) and a real copy of checkpoint-2."""
    out = tmp_path / "out"
    shutil.copytree(real_run / "checkpoint-1", out / "checkpoint-1", copy_function=os.link)
    shutil.copytree(real_run / "checkpoint-2", out / "checkpoint-2")
    yield out
    shutil.rmtree(tmp_path, ignore_errors=True)  # ~40 MB per test


def edit_manifest(checkpoint: Path, edit: Callable[[dict], object]) -> None:
    """Rewrite ``checkpoint``'s manifest after ``edit`` changed it in place."""
    path = checkpoint / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def replace_manifest(checkpoint: Path, value) -> None:
    (checkpoint / "manifest.json").write_text(json.dumps(value))


def unlist(checkpoint: Path, *names: str) -> None:
    """Remove files from a checkpoint and from its manifest alike."""
    for name in names:
        target = checkpoint / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    kept = lambda m: {k: v for k, v in m["files"].items() if not k.startswith(names)}  # noqa: E731
    edit_manifest(checkpoint, lambda m: m.update(files=kept(m)))


def add_listed(checkpoint: Path, name: str, data: bytes) -> None:
    """Add a file to a checkpoint and list it with its true size and hash."""
    (checkpoint / name).write_bytes(data)
    entry = {"size": len(data), "sha256": checkpoint_manifest._sha256(checkpoint / name)}
    edit_manifest(checkpoint, lambda m: m["files"].update({name: entry}))


def set_entry(name: str, **fields) -> Callable[[dict], None]:
    return lambda m: m["files"][name].update(fields)


def symlink_to_copy(checkpoint: Path, name: str) -> None:
    """Replace a listed file or directory with a symlink to an identical copy outside the checkpoint."""
    target = checkpoint.parent.parent / ("outside-" + name.replace("/", "_"))
    (shutil.copytree if (checkpoint / name).is_dir() else shutil.copy2)(checkpoint / name, target)
    shutil.rmtree(checkpoint / name) if (checkpoint / name).is_dir() else (checkpoint / name).unlink()
    (checkpoint / name).symlink_to(target)


# (damage to checkpoint-2, the message its CheckpointError must contain)
DAMAGE = {
    "invalid-json": (lambda c: (c / "manifest.json").write_text('{"format": 1,'), "manifest.json is not valid JSON"),
    "not-utf8": (lambda c: (c / "manifest.json").write_bytes(b"\xff\xfe\x00{"), "manifest.json is not valid JSON"),
    "deep-nesting": (lambda c: (c / "manifest.json").write_text("[" * 200_000), "manifest.json is not valid JSON"),
    "list": (lambda c: replace_manifest(c, []), "manifest.json holds a JSON list, not an object"),
    "only-files-int": (lambda c: replace_manifest(c, {"files": 3}), "manifest.json has no 'format' field"),
    "files-int": (lambda c: edit_manifest(c, lambda m: m.update(files=3)), "'files' is a JSON int, not an object"),
    "no-global-step": (lambda c: edit_manifest(c, lambda m: m.pop("global_step")), "has no 'global_step' field"),
    "step-string": (lambda c: edit_manifest(c, lambda m: m.update(global_step="2")), "'global_step' is '2'; it must"),
    "format-bool": (lambda c: edit_manifest(c, lambda m: m.update(format=True)), "'format' is True; it must be a"),
    "format-newer": (lambda c: edit_manifest(c, lambda m: m.update(format=2)), "has format 2; this steadyrl reads"),
    "layout": (lambda c: edit_manifest(c, lambda m: m.update(layout=["x"])), "'layout' is ['x']; it must be one of"),
    "step-other": (
        lambda c: edit_manifest(c, lambda m: m.update(global_step=1)),
        "manifest.json says global_step 1, but the directory is named checkpoint-2",
    ),
    "entry-list": (lambda c: edit_manifest(c, lambda m: m["files"].update({"scheduler.pt": []})), "is a JSON list"),
    "size-string": (
        lambda c: edit_manifest(c, set_entry("scheduler.pt", size="1465")),
        "the manifest gives scheduler.pt the size '1465', not a byte count",
    ),
    "size-negative": (lambda c: edit_manifest(c, set_entry("scheduler.pt", size=-1)), "the size -1, not a byte count"),
    "sha-upper": (
        lambda c: edit_manifest(c, lambda m: m["files"]["scheduler.pt"].update(sha256="A" * 64)),
        f"the manifest gives scheduler.pt the sha256 '{'A' * 64}', not 64 hex digits",
    ),
    "sha-missing": (
        lambda c: edit_manifest(c, lambda m: m["files"]["scheduler.pt"].pop("sha256")),
        "the sha256 None, not 64 hex digits",
    ),
    "dotdot": (
        lambda c: edit_manifest(c, lambda m: m["files"].update({"../x": m["files"]["scheduler.pt"]})),
        "the manifest lists '../x', whose '..' leaves the checkpoint",
    ),
    "dotdot-inside": (
        lambda c: edit_manifest(c, lambda m: m["files"].update({"actor/../../x": m["files"]["scheduler.pt"]})),
        "whose '..' leaves the checkpoint",
    ),
    "absolute": (
        lambda c: edit_manifest(c, lambda m: m["files"].update({"/etc/passwd": m["files"]["scheduler.pt"]})),
        "the manifest lists '/etc/passwd', an absolute path outside the checkpoint",
    ),
    "backslash": (
        lambda c: edit_manifest(c, lambda m: m["files"].update({"actor\\x": m["files"]["scheduler.pt"]})),
        "whose backslash is not a POSIX separator",
    ),
    "empty-part": (
        lambda c: edit_manifest(c, lambda m: m["files"].update({"actor//x": m["files"]["scheduler.pt"]})),
        "the manifest lists 'actor//x', which is not a file name inside it",
    ),
    "lists-itself": (
        lambda c: edit_manifest(c, lambda m: m["files"].update({"manifest.json": m["files"]["scheduler.pt"]})),
        "the manifest lists 'manifest.json', which is not a file name inside it",
    ),
    "no-state": (
        lambda c: unlist(c, "steadyrl_state.json"),
        "the manifest does not list steadyrl_state.json, which a steadyrl checkpoint holds",
    ),
    "no-optimizer": (lambda c: unlist(c, "optimizer.pt"), "does not list optimizer.pt or optimizer_0.pt, which"),
    "no-rng-state": (lambda c: unlist(c, "rng_state_0.json"), "does not list rng_state_0.json, which"),
    "no-actor": (
        lambda c: unlist(c, "model.safetensors"),  # and its index
        "the manifest does not list the actor's weights (model.safetensors or adapter_model.safetensors, or actor/),",
    ),
    "rank-files": (  # a manifest that does not record its process count (written before it was): the files tell
        lambda c: (edit_manifest(c, lambda m: m.pop("processes")), add_listed(c, "rng_state_1.json", b"{}")),
        "the manifest lists files of 2 processes but no meter file of process(es) [1]",
    ),
    "rank-files-extra": (
        lambda c: add_listed(c, "rng_state_1.json", b"{}"),
        "the manifest lists a rng_state file of process(es) [1], but the checkpoint was written by 1 process(es)",
    ),
    "processes-missing": (  # e.g. a machine whose files the main process did not see
        lambda c: edit_manifest(c, lambda m: m.update(processes=2)),
        "the manifest lists files of 2 processes but no meter file of process(es) [1]",
    ),
    "processes-zero": (lambda c: edit_manifest(c, lambda m: m.update(processes=0)), "'processes' is 0; it must be"),
    "unlisted": (
        lambda c: (c / "notes.txt").write_text("mine"),
        "checkpoint-2: file notes.txt is not listed in the manifest; a checkpoint holds only the files it lists",
    ),
    # nested files: in a checkpoint of the earlier layout, whose actor is under actor/ (support/old_layout.py)
    "unlisted-nested": (
        lambda c: (to_old_layout(c) / "actor" / "x.bin").write_bytes(b""),
        "file actor/x.bin is not listed in the",
    ),
    "symlink-file": (
        lambda c: symlink_to_copy(c, "tokenizer.json"),
        "checkpoint-2: tokenizer.json is a symlink; a checkpoint holds only regular files",
    ),
    "symlink-nested": (
        lambda c: symlink_to_copy(to_old_layout(c), "actor/tokenizer.json"),
        "checkpoint-2: actor/tokenizer.json is a symlink; a checkpoint holds only regular files",
    ),
    "symlink-dir": (
        lambda c: symlink_to_copy(to_old_layout(c), "actor"),
        "checkpoint-2: actor is a symlink; a checkpoint holds only",
    ),
    "symlink-manifest": (lambda c: symlink_to_copy(c, "manifest.json"), "checkpoint-2: manifest.json is a symlink"),
    "symlink-unlisted": (lambda c: (c / "link").symlink_to("/etc/hostname"), "checkpoint-2: link is a symlink"),
    "fifo": (
        lambda c: os.mkfifo(to_old_layout(c) / "actor" / "pipe"),
        "checkpoint-2: actor/pipe is not a regular file",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_each_damage_is_named_and_resume_falls_back_to_the_older_checkpoint(out, damage, capsys):
    damage_fn, message = DAMAGE[damage]
    damage_fn(out / "checkpoint-2")
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(out / "checkpoint-2")
    assert message in str(err.value)
    scan = scan_checkpoints(out)  # never raises
    assert [step for step, _ in scan.complete] == [1]
    assert [(path.name, message in reason) for path, reason in scan.rejected] == [("checkpoint-2", True)]
    assert find_resumable_checkpoint(out) == out / "checkpoint-1"
    capsys.readouterr()
    assert steadyrl_main(["checkpoints", str(out)]) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["2"])
    assert "damaged" in row and message in row and "<-" not in row


def test_a_real_checkpoint_lists_every_required_file_and_verifies(real_run):
    manifest = verify_checkpoint(real_run / "checkpoint-2")
    assert manifest["global_step"] == 2 and manifest["layout"] == "steadyrl"
    listed = set(manifest["files"])
    on_disk = {p.relative_to(real_run / "checkpoint-2").as_posix() for p in (real_run / "checkpoint-2").rglob("*")}
    assert listed == {name for name in on_disk if (real_run / "checkpoint-2" / name).is_file()} - {"manifest.json"}
    for required in checkpoint_manifest.REQUIRED_FILES["steadyrl"]:
        assert any(
            name == choice or (choice.endswith("/") and name.startswith(choice))
            for name in listed
            for choice in required.split("|")
        ), required


def test_a_manifest_without_layout_is_a_steadyrl_one(out):
    """Manifests written before the layout field verify, with the steadyrl checkpoint's required files."""
    edit_manifest(out / "checkpoint-2", lambda m: m.pop("layout"))
    verify_checkpoint(out / "checkpoint-2")
    unlist(out / "checkpoint-2", "scheduler.pt")
    with pytest.raises(CheckpointError, match="does not list scheduler.pt, which a steadyrl checkpoint holds"):
        verify_checkpoint(out / "checkpoint-2")


def test_write_manifest_detects_the_layout_and_refuses_what_could_not_verify(out, tmp_path):
    trainer_dir = tmp_path / "checkpoint-3"  # a plain transformers.Trainer checkpoint, as CheckpointCallback sees it
    trainer_dir.mkdir()
    (trainer_dir / "trainer_state.json").write_text("{}")
    (trainer_dir / "model.safetensors").write_bytes(b"weights")
    write_manifest(trainer_dir, 3)
    assert verify_checkpoint(trainer_dir)["layout"] == "transformers"
    (trainer_dir / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="does not list steadyrl_state.json"):
        write_manifest(trainer_dir, 3, layout="steadyrl")
    assert not (trainer_dir / "manifest.json").exists()

    checkpoint = out / "checkpoint-2"
    (checkpoint / "manifest.json").unlink()
    symlink_to_copy(checkpoint, "config.json")
    with pytest.raises(CheckpointError, match="config.json is a symlink"):
        write_manifest(checkpoint, 2)
    assert not (checkpoint / "manifest.json").exists()
    (checkpoint / "config.json").unlink()
    shutil.copy2(tmp_path / "outside-config.json", checkpoint / "config.json")
    (checkpoint / "manifest.json.tmp").write_text("left by a killed write")
    write_manifest(checkpoint, 2)
    assert "manifest.json.tmp" not in verify_checkpoint(checkpoint)["files"]


def test_a_commit_is_refused_unless_every_process_wrote_its_files(out):
    """Committed for 2 processes, a directory holding the files of one (the other machine's missing) gets no
    manifest and no final name."""
    tmp = out / "tmp-checkpoint-2"
    os.rename(out / "checkpoint-2", tmp)
    (tmp / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"files of 2 processes but no \w+ file of process\(es\) \[1\]"):
        commit_checkpoint(tmp, 2, processes=2)
    assert not (out / "checkpoint-2").exists() and not (tmp / "manifest.json").exists()
    commit_checkpoint(tmp, 2, processes=1)
    assert verify_checkpoint(out / "checkpoint-2")["processes"] == 1


# ---- interrupted commits --------------------------------------------------------------------------------------------


def test_a_complete_tmp_checkpoint_is_promoted(out):
    os.rename(out / "checkpoint-2", out / "tmp-checkpoint-2")  # killed between the manifest and the rename
    assert find_resumable_checkpoint(out) == out / "checkpoint-1"
    done = recover_interrupted_commits(out)
    assert len(done) == 1 and "Promoted" in done[0] and "tmp-checkpoint-2" in done[0]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1", "checkpoint-2"]
    verify_checkpoint(out / "checkpoint-2")
    assert find_resumable_checkpoint(out) == out / "checkpoint-2"
    assert recover_interrupted_commits(out) == []


@pytest.mark.parametrize("how", ["no-manifest", "manifest-tmp-only", "file-missing", "truncated", "other-step"])
def test_an_incomplete_tmp_checkpoint_is_left_as_it_is(out, how):
    tmp = out / "tmp-checkpoint-2"
    os.rename(out / "checkpoint-2", tmp)
    if how == "no-manifest":
        (tmp / "manifest.json").unlink()
    elif how == "manifest-tmp-only":  # killed inside write_manifest
        os.rename(tmp / "manifest.json", tmp / "manifest.json.tmp")
    elif how == "file-missing":
        (tmp / "optimizer.pt").unlink()
    elif how == "truncated":
        (tmp / "model.safetensors").write_bytes(b"")
    else:
        os.rename(tmp, out / "tmp-checkpoint-3")
        tmp = out / "tmp-checkpoint-3"
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert recover_interrupted_commits(out) == []
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert tmp.name in [path.name for path, _ in scan_checkpoints(out).rejected]
    assert find_resumable_checkpoint(out) == out / "checkpoint-1"


def test_a_complete_tmp_beside_a_complete_checkpoint_is_discarded_and_leftovers_removed(out):
    shutil.copytree(out / "checkpoint-2", out / "tmp-checkpoint-2")
    shutil.copytree(out / "checkpoint-1", out / "deleting-checkpoint-1")  # a crashed rotation
    (out / "deleting-checkpoint-1" / "optimizer.pt").unlink()
    state = (out / "checkpoint-2" / "trainer_state.json").read_bytes()
    done = recover_interrupted_commits(out)
    assert len(done) == 2 and "tmp-checkpoint-2" in done[0] and "deleting-checkpoint-1" in done[1]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1", "checkpoint-2"]
    assert (out / "checkpoint-2" / "trainer_state.json").read_bytes() == state
    verify_checkpoint(out / "checkpoint-2")


class Crash(Exception):
    """The process dies here."""


def new_write_of_step_2(real_run: Path, out: Path) -> bytes:
    """Fill tmp-checkpoint-2 as a save does (the real checkpoint-2's files, with a trainer_state.json of its own)."""
    tmp = out / "tmp-checkpoint-2"
    shutil.copytree(real_run / "checkpoint-2", tmp, copy_function=os.link)  # nothing below is modified in place
    (tmp / "manifest.json").unlink()
    state = (tmp / "trainer_state.json").read_text()
    (tmp / "trainer_state.json").unlink()
    (tmp / "trainer_state.json").write_text(state + "\n")
    return (tmp / "trainer_state.json").read_bytes()


def crash_at(monkeypatch, k: int) -> list[str]:
    """Make the k-th file-system step of commit_checkpoint after its manifest (a rename, a directory fsync or a
    removal) crash; a removal crashes halfway through. Return the steps performed."""
    done, armed = [], []
    real = {"rename": os.rename, "fsync": checkpoint_files.fsync_dir, "remove": checkpoint_files._remove}
    real_write = checkpoint_files.write_manifest

    def write_manifest(*args, **kwargs):
        real_write(*args, **kwargs)
        armed.append(True)

    def step(kind):
        def run(path, *args):
            if armed and len(done) == k:
                if kind == "remove" and Path(path).is_dir():
                    for file in sorted(Path(path).rglob("*"))[::2]:
                        if file.is_file():
                            file.unlink()
                raise Crash(kind)
            if armed:
                done.append(f"{kind} {Path(path).name}")
            return real[kind](path, *args)

        return run

    monkeypatch.setattr(checkpoint_files, "write_manifest", write_manifest)
    monkeypatch.setattr(checkpoint_files.os, "rename", step("rename"))
    monkeypatch.setattr(checkpoint_files, "fsync_dir", step("fsync"))
    monkeypatch.setattr(checkpoint_files, "_remove", step("remove"))
    return done


@pytest.mark.parametrize("old", ["absent", "complete", "damaged"])
def test_every_crash_point_of_a_commit_recovers_to_a_complete_checkpoint(real_run, out, monkeypatch, old):
    if old == "absent":
        shutil.rmtree(out / "checkpoint-2")
    elif old == "damaged":
        (out / "checkpoint-2" / "scheduler.pt").write_bytes(b"\0" * 1465)
    pristine = out.parent / "pristine"
    os.rename(out, pristine)
    sequence = ["rename tmp-checkpoint-2", "fsync out"]
    if old != "absent":  # the old copy is renamed aside first, and removed only once the new one is in place
        sequence = ["remove replaced-checkpoint-2", "rename checkpoint-2", *sequence, "remove replaced-checkpoint-2"]
    steps = len(sequence)
    for k in range(steps + 1):
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(pristine, out, copy_function=os.link)  # files are renamed and removed, never rewritten
        old_state = (out / "checkpoint-2" / "trainer_state.json").read_bytes() if old != "absent" else None
        new_state = new_write_of_step_2(real_run, out)
        with monkeypatch.context() as patch:
            done = crash_at(patch, k)
            if k < steps:
                with pytest.raises(Crash):
                    commit_checkpoint(out / "tmp-checkpoint-2", 2)
            else:
                commit_checkpoint(out / "tmp-checkpoint-2", 2)
        assert done == sequence[:k]
        recover_interrupted_commits(out)
        assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1", "checkpoint-2"], (k, done)
        verify_checkpoint(out / "checkpoint-2")
        kept_old = old == "complete" and k <= 1  # a complete checkpoint-2 and a complete tmp: the tmp goes
        expected = old_state if kept_old else new_state
        assert (out / "checkpoint-2" / "trainer_state.json").read_bytes() == expected, (k, done)


def test_a_commit_replaces_a_leftover_aside_copy(real_run, out):
    shutil.copytree(out / "checkpoint-2", out / "replaced-checkpoint-2")  # from a re-commit that crashed earlier
    new_state = new_write_of_step_2(real_run, out)
    commit_checkpoint(out / "tmp-checkpoint-2", 2)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1", "checkpoint-2"]
    assert (out / "checkpoint-2" / "trainer_state.json").read_bytes() == new_state


# ---- export and push ------------------------------------------------------------------------------------------------


ACTOR_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


@pytest.mark.parametrize("layout", ["top level", "actor/"])
def test_export_refuses_a_checkpoint_with_an_unlisted_file_and_copies_only_the_actors(out, tmp_path, capsys, layout):
    """Of either layout: the actor's files at the checkpoint's top level, or under actor/ (an earlier version's)."""
    checkpoint = out / "checkpoint-2"
    actor = checkpoint if layout == "top level" else to_old_layout(checkpoint) / "actor"
    (actor / "notes.txt").write_text("not part of the model")
    assert steadyrl_main(["export", str(checkpoint), str(tmp_path / "model")]) == 2
    notes = (actor / "notes.txt").relative_to(checkpoint).as_posix()
    assert f"file {notes} is not listed in the manifest" in capsys.readouterr().err
    assert not (tmp_path / "model").exists()
    (actor / "notes.txt").unlink()
    assert steadyrl_main(["export", str(checkpoint), str(tmp_path / "model")]) == 0
    assert {p.name for p in (tmp_path / "model").iterdir()} == ACTOR_FILES  # the top level's weights index stays


def test_export_refuses_a_checkpoint_without_an_actor(tmp_path, capsys):
    checkpoint = (
        tmp_path / "checkpoint-3"
    )  # a plain transformers.Trainer checkpoint: it verifies, but is no steadyrl one
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    write_manifest(checkpoint, 3)
    assert steadyrl_main(["export", str(checkpoint), str(tmp_path / "model")]) == 2
    assert (
        "checkpoint-3 has no actor: its manifest (transformers layout) lists no actor file" in capsys.readouterr().err
    )
    assert not (tmp_path / "model").exists()


def test_push_refuses_a_damaged_checkpoint_before_any_upload(out, monkeypatch, capsys):
    from steadyrl.publish import hub

    monkeypatch.setattr(hub, "upload", lambda *a, **k: pytest.fail("a damaged checkpoint was uploaded"))
    symlink_to_copy(out / "checkpoint-2", "model.safetensors")
    assert steadyrl_main(["push", str(out / "checkpoint-2"), "someone/model"]) == 2
    assert "model.safetensors is a symlink" in capsys.readouterr().err


def test_a_saved_actor_directory_is_staged_without_its_symlinks(real_run, tmp_path):
    from steadyrl.publish.export import export_actor
    from steadyrl.publish.hub import actor_of, stage_actor

    actor = export_actor(real_run / "checkpoint-2", tmp_path / "actor")
    saved = {p.name for p in actor.iterdir()}
    (tmp_path / "secret.txt").write_text("token")
    (actor / "notes.txt").symlink_to(tmp_path / "secret.txt")
    (actor / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    (actor / "sub").mkdir()
    path, files = actor_of(actor)
    assert path == actor and "notes.txt" not in files and "linked-dir" not in files
    staged = stage_actor(path, tmp_path / "staged", merged=False, files=files)
    default = stage_actor(path, tmp_path / "staged-default", merged=False)
    for directory in (staged, default):
        names = {p.name for p in directory.iterdir()}
        assert names == saved
        assert not any(p.is_symlink() for p in directory.rglob("*"))
