"""One run per output directory: an exclusive lock, and what a fresh start or a resume does with the checkpoints
already there.

- A fresh start refuses a directory that holds checkpoints (another run's: they would rotate the new run's away,
  and ``resume_from_checkpoint=True`` would pick them up), unless ``overwrite_output_dir`` deletes them first.
- A resume from ``checkpoint-N`` moves the newer checkpoints of the directory aside, to ``superseded-<time>/``:
  nothing is deleted, and neither rotation nor a later resume sees them.
- The lock is a ``fcntl.flock`` on ``.steadyrl-run.lock``: the kernel releases it when its process dies, so a
  killed run never blocks its restart.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from transformers.utils import logging

from .files import CHECKPOINT_PATTERN, TEMP_PATTERN, discard_checkpoint
from .manifest import CheckpointError, read_manifest

logger = logging.get_logger(__name__)

LOCK_NAME = ".steadyrl-run.lock"


class OutputDirInUse(CheckpointError):
    """Another process holds the output directory's lock."""


class OutputDirLock:
    """An exclusive lock on ``output_dir`` for the life of a run (the main process takes it)."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.path = Path(output_dir) / LOCK_NAME
        self.file = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            file = open(self.path, "a+")
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                file.seek(0)
                holder = file.read().strip()
                file.close()
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                raise OutputDirInUse(
                    f"output_dir={str(self.path.parent)!r} is in use by another run ({describe_holder(holder)}): two "
                    "runs writing one directory would mix their checkpoints. Wait for that run to end, stop it, or "
                    "give this run another output_dir."
                ) from None
            if self.path.exists() and os.stat(self.path).st_ino == os.fstat(file.fileno()).st_ino:
                break
            file.close()  # the holder removed the file as we opened it: lock the new one
        file.seek(0)
        file.truncate()
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}, file)
        file.flush()
        self.file = file

    def release(self) -> None:
        """Remove the lock file, then unlock (a process that opened the removed file sees so and retries)."""
        if self.file is not None:
            self.path.unlink(missing_ok=True)
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"process {holder['pid']} on host {holder['host']}, since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def checkpoint_dirs(output_dir: Path) -> list[tuple[int, Path]]:
    """Every ``checkpoint-N`` directory (complete or not), by step."""
    if not output_dir.is_dir():
        return []
    matches = [(CHECKPOINT_PATTERN.match(path.name), path) for path in output_dir.iterdir() if path.is_dir()]
    return sorted((int(match.group(1)), path) for match, path in matches if match)


def remove_checkpoints(output_dir: Path) -> list[str]:
    """``overwrite_output_dir``: delete every checkpoint and partial checkpoint, each renamed away first so that a
    crash leaves no half-deleted ``checkpoint-N``; return their names."""
    doomed = [p for p in output_dir.iterdir() if p.is_dir() and (CHECKPOINT_PATTERN.match(p.name) or
                                                                    TEMP_PATTERN.match(p.name))]  # fmt: skip
    for path in doomed:
        discard_checkpoint(path)
    return sorted(p.name for p in doomed)


def move_aside(output_dir: Path, paths: list[Path]) -> Path:
    """Move ``paths`` into a new ``superseded-<time>`` directory of ``output_dir``; return it."""
    aside = output_dir / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 1
    while aside.exists():
        aside, suffix = aside.with_name(f"{aside.name.split('.')[0]}.{suffix}"), suffix + 1
    aside.mkdir()
    for path in paths:
        os.rename(path, aside / path.name)
    return aside


def refuse_other_runs(output_dir: str | os.PathLike, checkpoint: Path | None, overwrite: bool) -> None:
    """Before a run starts from ``checkpoint`` (None: a fresh start) in ``output_dir`` (main process, under the
    lock): refuse another run's checkpoints, or with ``overwrite`` delete them."""
    output_dir = Path(output_dir)
    if checkpoint is not None and checkpoint.resolve().parent == output_dir.resolve():
        return  # its own lineage: newer checkpoints are moved aside once the checkpoint has loaded
    existing = checkpoint_dirs(output_dir)
    if existing and not overwrite:
        names = ", ".join(path.name for _, path in existing)
        start = "A fresh start" if checkpoint is None else f"Resuming from {checkpoint}, outside it,"
        raise CheckpointError(
            f"output_dir={str(output_dir)!r} holds checkpoints of another run ({names}). {start} would mix with "
            "them: rotation would delete this run's checkpoints and resume_from_checkpoint=True would pick up "
            "theirs. Continue that run with resume_from_checkpoint=True, delete them with overwrite_output_dir=True, "
            "or use another output_dir."
        )
    if output_dir.is_dir() and (removed := remove_checkpoints(output_dir)):
        why = "overwrite_output_dir=True" if existing else "partial checkpoints of a run stopped in its first save"
        logger.warning(f"Deleted {', '.join(removed)} from {output_dir} before starting ({why}).")


def supersede_newer(output_dir: str | os.PathLike, checkpoint: Path) -> None:
    """After resuming from ``checkpoint``: move the newer checkpoints of ``output_dir`` aside (nothing is deleted),
    so that the resumed run's checkpoints neither mix with nor rotate them."""
    output_dir = Path(output_dir)
    if checkpoint.resolve().parent != output_dir.resolve():
        return
    step = read_manifest(checkpoint)["global_step"]
    newer = [path for n, path in checkpoint_dirs(output_dir) if n > step]
    if newer:
        aside = move_aside(output_dir, newer)
        logger.warning(f"Resumed from {checkpoint.name}: moved the newer {', '.join(p.name for p in newer)} to "
                       f"{aside} (nothing is deleted).")  # fmt: skip
