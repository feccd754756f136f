"""Checkpoint directories on disk: atomic creation, a sha256 manifest, discovery and rotation.

A checkpoint is written under ``tmp-checkpoint-<step>``, every file is hashed and fsynced into
``manifest.json`` (written last), and only then is the directory renamed to ``checkpoint-<step>``.
A directory without a manifest, or whose files do not match it, is never resumed from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from transformers.utils import logging

logger = logging.get_logger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
TEMP_PATTERN = re.compile(r"^tmp-checkpoint-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, damaged, or does not fit the current run."""


def checkpoint_name(step: int) -> str:
    return f"checkpoint-{step}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
        os.fsync(f.fileno())
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: str | os.PathLike, global_step: int) -> None:
    """Hash, fsync and list every file below ``directory``; the manifest is the completion marker."""
    directory = Path(directory)
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
        files[path.relative_to(directory).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    for sub in sorted({p.parent for p in directory.rglob("*") if p.is_file()}):
        _fsync_dir(sub)
    manifest = {"format": MANIFEST_FORMAT, "global_step": global_step, "files": files}
    tmp = directory / (MANIFEST_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST_NAME)
    _fsync_dir(directory)


def verify_checkpoint(directory: str | os.PathLike) -> dict:
    """Return the manifest if every listed file exists with its recorded size and hash; else raise CheckpointError."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        raise CheckpointError(f"{directory} has no {MANIFEST_NAME}: it was not completely written")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{manifest_path} is unreadable: {err}") from err
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{directory}: file {name} listed in the manifest is missing")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"{directory}: file {name} has {size} bytes, the manifest says {expected['size']}")
        if _sha256(path) != expected["sha256"]:
            raise CheckpointError(f"{directory}: file {name} does not match its sha256 in the manifest")
    return manifest


def begin_checkpoint(output_dir: str | os.PathLike, step: int) -> Path:
    """Create an empty ``tmp-checkpoint-<step>`` (replacing a stale one from a killed save) to fill."""
    tmp = Path(output_dir) / f"tmp-{checkpoint_name(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit_checkpoint(tmp: str | os.PathLike, step: int) -> Path:
    """Write the manifest of a filled temporary directory, then rename it to ``checkpoint-<step>``.

    Until the rename, nothing under the final name changes; a crash leaves only the temporary directory.
    """
    tmp = Path(tmp)
    final = tmp.parent / checkpoint_name(step)
    write_manifest(tmp, step)
    if final.exists():  # a stale or damaged copy left from before a resume to an older step
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(tmp.parent)
    return final


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


def find_resumable_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in ``output_dir``, warning about each newer one that is skipped."""
    scan = scan_checkpoints(output_dir)
    newest = scan.complete[-1][0] if scan.complete else -1
    for path, reason in scan.rejected:
        match = TEMP_PATTERN.match(path.name) or CHECKPOINT_PATTERN.match(path.name)
        if int(match.group(1)) > newest:
            logger.warning(f"Not resuming from {path}: {reason}")
    return scan.newest


def rotate_checkpoints(output_dir: str | os.PathLike, save_total_limit: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``save_total_limit`` (never the newest); return them.

    Each is first renamed to ``deleting-checkpoint-<step>`` (atomic), so a crash mid-deletion leaves no
    half-deleted ``checkpoint-<step>``; leftovers of such a crash are removed by the next rotation.
    """
    if not save_total_limit or save_total_limit < 1:
        return []
    complete = scan_checkpoints(output_dir, verify=False).complete
    doomed = [path for _, path in complete[: max(0, len(complete) - save_total_limit)]]
    for path in doomed:
        os.rename(path, path.with_name(f"deleting-{path.name}"))
    for path in Path(output_dir).glob("deleting-checkpoint-*"):
        shutil.rmtree(path, ignore_errors=True)
    return doomed
