"""Checkpoint directories on disk: atomic creation, commit, recovery of interrupted commits, discovery and rotation.

A checkpoint is written under ``tmp-checkpoint-<step>``, every file is hashed and fsynced into
``manifest.json`` (written last, manifest.py), and only then is the directory renamed to ``checkpoint-<step>``.
A checkpoint is removed by renaming it to ``deleting-checkpoint-<step>`` first, so none is ever half-deleted. A
commit that replaces an existing ``checkpoint-<step>`` renames the old one to ``replaced-checkpoint-<step>`` and
removes it only once the new one has its name; until then it is what a failure or a crash puts back.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from transformers.utils import logging

from ..durable import fsync_dir
from ..ops.finite import first_names
from .health import nonfinite_in_checkpoint
from .manifest import MANIFEST_NAME, STATE_FILE, CheckpointError, verify_checkpoint, write_manifest

logger = logging.get_logger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
TEMP_PATTERN = re.compile(r"^tmp-checkpoint-(\d+)$")
ASIDE_PREFIX = "deleting-"  # a checkpoint renamed (atomically) before it is removed: doomed, whatever happens
REPLACED_PREFIX = "replaced-"  # the old copy of a checkpoint a commit replaces: put back if the new one is not in place


def checkpoint_name(step: int) -> str:
    return f"checkpoint-{step}"


def begin_checkpoint(output_dir: str | os.PathLike, step: int) -> Path:
    """Create an empty ``tmp-checkpoint-<step>`` (replacing a stale one from a killed save) to fill."""
    tmp = Path(output_dir) / f"tmp-{checkpoint_name(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit_checkpoint(tmp: str | os.PathLike, step: int, processes: int | None = None) -> Path:
    """Write the manifest of a filled temporary directory (which must hold the files of ``processes`` processes,
    when given), then rename it to ``checkpoint-<step>``.

    Until the rename, nothing under the final name changes. A ``checkpoint-<step>`` already there (a stale or damaged
    copy left from before a resume to an older step) is renamed aside and removed only once the new one is in place;
    a failed rename puts it back, and a crash at any point leaves a state that recover_interrupted_commits turns into
    a ``checkpoint-<step>`` again (the new one when it is complete).
    """
    tmp = Path(tmp)
    write_manifest(tmp, step, layout="steadyrl", processes=processes)
    return _install(tmp, tmp.parent / checkpoint_name(step))


def finish_trainer_checkpoint(output_dir: str | os.PathLike, step: int) -> None:
    """After a plain ``transformers.Trainer`` has (re)written ``checkpoint-<step>``: write its manifest, over any
    earlier one, so that resume accepts only finished directories. A steadyrl checkpoint is committed already."""
    directory = Path(output_dir) / checkpoint_name(step)
    if directory.is_dir() and not (directory / STATE_FILE).exists():
        write_manifest(directory, step, layout="transformers")


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _remove(path: Path) -> None:
    """Delete a directory tree, or a file or symlink (never what a symlink points to); a missing path is fine."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _install(tmp: Path, final: Path) -> Path:
    """Rename the complete ``tmp`` to ``final``. A ``final`` already there is first renamed (atomically) to
    ``replaced-<final>``, renamed back if ``tmp`` cannot take its name, and removed only once it has: each copy
    exists under one name or another throughout."""
    aside = final.with_name(REPLACED_PREFIX + final.name)
    replacing = _exists(final)
    if replacing:
        _remove(aside)  # left by an earlier crash beside a final copy: the rename needs the name free
        os.rename(final, aside)
    try:
        os.rename(tmp, final)
    except OSError:
        if replacing:
            os.rename(aside, final)  # should this fail too, recover_interrupted_commits puts it back
        raise
    fsync_dir(final.parent)
    if replacing:
        _remove(aside)
    return final


def recover_interrupted_commits(output_dir: str | os.PathLike) -> list[str]:
    """Finish what a crashed commit, re-commit or rotation left in ``output_dir``; return one line per action.

    A complete ``tmp-checkpoint-N`` (its manifest verifies: the crash fell between the manifest and the rename)
    becomes ``checkpoint-N`` when there is none or only a damaged one, and is removed when a complete one exists.
    Incomplete ones stay as they are (the scan reports them; the next save of that step replaces them). Then a
    ``replaced-checkpoint-N`` (the old copy a commit moved aside) is removed where ``checkpoint-N`` now exists, and
    renamed back to it where not; every ``deleting-checkpoint-*`` is removed (rotation or overwrite_output_dir
    doomed it). Call it on the main process alone, before any other process scans ``output_dir``.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    done = []
    for tmp in sorted(output_dir.iterdir()):
        if TEMP_PATTERN.match(tmp.name) and tmp.is_dir() and not tmp.is_symlink():
            done += _recover(tmp)
    for old in sorted(output_dir.glob(REPLACED_PREFIX + "checkpoint-*")):
        final = old.with_name(old.name.removeprefix(REPLACED_PREFIX))
        if _exists(final):
            _remove(old)
            done.append(f"Removed {old}: the commit that replaced it with {final} stopped before deleting it.")
        else:
            os.rename(old, final)
            fsync_dir(output_dir)
            done.append(f"Renamed {old} back to {final}: the commit meant to replace it stopped before its new copy.")
    for aside in sorted(output_dir.glob(ASIDE_PREFIX + "checkpoint-*")):
        _remove(aside)
        done.append(f"Removed {aside}, left by a rotation or re-commit that stopped before deleting it.")
    return done


def _recover(tmp: Path) -> list[str]:
    final = tmp.with_name(tmp.name.removeprefix("tmp-"))
    try:
        verify_checkpoint(tmp)
    except CheckpointError:
        return []
    if not _exists(final):
        _install(tmp, final)
        return [f"Promoted {tmp} to {final}: it was complete, and the run stopped before renaming it."]
    try:
        verify_checkpoint(final)
    except CheckpointError as err:
        _install(tmp, final)
        return [f"Replaced {final} with the complete {tmp}: {err}"]
    _remove(tmp)
    return [f"Removed {tmp}: it was complete, but so is {final}, which stays."]


@dataclass
class CheckpointScan:
    """What ``output_dir`` holds: complete checkpoints (oldest first) and rejected directories with reasons."""

    complete: list[tuple[int, Path]]
    rejected: list[tuple[Path, str]]

    @property
    def newest(self) -> Path | None:
        return self.complete[-1][1] if self.complete else None


def scan_checkpoints(output_dir: str | os.PathLike, verify: bool = True) -> CheckpointScan:
    """Classify every ``checkpoint-*`` and ``tmp-checkpoint-*`` directory in ``output_dir``."""
    output_dir = Path(output_dir)
    complete, rejected = [], []
    if not output_dir.is_dir():
        return CheckpointScan(complete, rejected)
    for entry in output_dir.iterdir():
        if not entry.is_dir():
            continue
        if TEMP_PATTERN.match(entry.name):
            rejected.append((entry, "incomplete: the run stopped while writing it"))
            continue
        match = CHECKPOINT_PATTERN.match(entry.name)
        if not match:
            continue
        try:
            if verify:
                verify_checkpoint(entry)
            elif not (entry / MANIFEST_NAME).is_file():
                raise CheckpointError(f"{entry} has no {MANIFEST_NAME}")
            complete.append((int(match.group(1)), entry))
        except CheckpointError as err:
            rejected.append((entry, str(err)))
    complete.sort()
    rejected.sort()
    return CheckpointScan(complete, rejected)


def newest_intact_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest ``checkpoint-N`` whose manifest is well formed and whose listed files are all there with their
    sizes: a check that hashes nothing, for messages (hashing every checkpoint can take hours on a shared
    filesystem)."""
    for _, path in reversed(scan_checkpoints(output_dir, verify=False).complete):
        try:
            verify_checkpoint(path, hashes=False)
            return path
        except CheckpointError:
            continue
    return None


def find_resumable_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in ``output_dir`` that holds finite numbers only, warning about each newer one
    that is skipped (incomplete, damaged, or written non-finite by an earlier steadyrl: health.py)."""
    scan = scan_checkpoints(output_dir)
    chosen = None
    for step, path in reversed(scan.complete):
        poisoned = nonfinite_in_checkpoint(path)
        if not poisoned:
            chosen = step, path
            break
        logger.warning(
            f"Not resuming from {path}: it holds NaN or infinite values ({first_names(poisoned, 3)}; an earlier "
            "steadyrl saved it without checking). Passed over for an older checkpoint; delete it once you no longer "
            "need it."
        )
    newest = chosen[0] if chosen else -1
    for path, reason in scan.rejected:
        match = TEMP_PATTERN.match(path.name) or CHECKPOINT_PATTERN.match(path.name)
        if int(match.group(1)) > newest:
            logger.warning(f"Not resuming from {path}: {reason}")
    return chosen[1] if chosen else None


def rotate_checkpoints(output_dir: str | os.PathLike, save_total_limit: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``save_total_limit`` (never the newest); return them.

    Each is first renamed to ``deleting-checkpoint-<step>`` (atomic), so a crash mid-deletion leaves no
    half-deleted ``checkpoint-<step>``; leftovers of such a crash are removed by the next rotation (and by
    recover_interrupted_commits).
    """
    if not save_total_limit or save_total_limit < 1:
        return []
    complete = scan_checkpoints(output_dir, verify=False).complete
    doomed = [path for _, path in complete[: max(0, len(complete) - save_total_limit)]]
    for path in doomed:
        discard_checkpoint(path)
    for path in Path(output_dir).glob(ASIDE_PREFIX + "checkpoint-*"):
        _remove(path)
    return doomed


def discard_checkpoint(path: Path) -> None:
    """Delete a checkpoint directory: renamed (atomically) to ``deleting-<name>`` first, so that a crash leaves no
    half-deleted ``checkpoint-N``; leftovers are removed by the next rotation and by recover_interrupted_commits."""
    aside = path.with_name(ASIDE_PREFIX + path.name)
    _remove(aside)  # a leftover of a crashed re-commit of that step: the rename needs the name free
    os.rename(path, aside)
    _remove(aside)
