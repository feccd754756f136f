"""One run per output directory: an exclusive lock, and what a fresh start or a resume does with the checkpoints
already there.

- A fresh start refuses a directory that holds checkpoints (another run's: they would rotate the new run's away,
  and ``resume_from_checkpoint=True`` would pick them up), unless ``overwrite_output_dir`` deletes them first.
- It also refuses a run that left no checkpoint (``save_strategy="no"``, or stopped before its first save) but its
  logs or a saved actor, which it would truncate and overwrite; so does ``resume_from_checkpoint=True`` when that
  run finished. A run stopped before its first save is started again by ``resume_from_checkpoint=True``.
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
import stat
import time
from pathlib import Path

from transformers.utils import logging

from .files import CHECKPOINT_PATTERN, TEMP_PATTERN, discard_checkpoint
from .manifest import CheckpointError, read_manifest

logger = logging.get_logger(__name__)

LOCK_NAME = ".steadyrl-run.lock"
RUN_LOGS = ("metrics.jsonl", "completions.jsonl")  # appended to by a run (run_summary.py, completion_log.py)
SAVED_ACTOR = ("actor", "model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
SUMMARY_KEY = b'"train_runtime"'  # in the summary line a run appends to metrics.jsonl as it ends


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
            file = self._open()
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
            if _same_file(self.path, os.fstat(file.fileno())):
                break
            file.close()  # the holder removed the file as we opened it: lock the new one
        file.seek(0)
        file.truncate()
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}, file)
        file.flush()
        self.file = file

    def _open(self):
        """The lock file, created if absent, never through a symlink (the truncation that records this run's
        name would empty whatever the link points to), and only if it is a regular file."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.EISDIR):  # ELOOP: a symlink, under O_NOFOLLOW
                raise
            fd = None
        if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
            return os.fdopen(fd, "r+")
        if fd is not None:
            os.close(fd)
        kind = "a symlink" if self.path.is_symlink() else "not a regular file"
        raise CheckpointError(
            f"output_dir={str(self.path.parent)!r} holds a {LOCK_NAME} that is {kind}: the run's lock must be a "
            "regular file steadyrl creates (it writes the holder's name into it, and never through a link). Remove "
            "it, or use another output_dir."
        )

    def release(self) -> None:
        """Remove the lock file, then unlock (a process that opened the removed file sees so and retries)."""
        if self.file is not None:
            self.path.unlink(missing_ok=True)
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def _same_file(path: Path, opened: os.stat_result) -> bool:
    """Whether ``path`` (not followed if a link) is still the file that was opened."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


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
    doomed = [
        p
        for p in output_dir.iterdir()
        if p.is_dir() and (CHECKPOINT_PATTERN.match(p.name) or TEMP_PATTERN.match(p.name))
    ]
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


def run_leftovers(output_dir: Path) -> list[str]:
    """What a run left in ``output_dir`` besides checkpoints: its logs (when not empty) and an actor it saved."""
    logs = [name for name in RUN_LOGS if (output_dir / name).is_file() and (output_dir / name).stat().st_size]
    actor = [name + "/" * (output_dir / name).is_dir() for name in SAVED_ACTOR if (output_dir / name).exists()]
    return logs + actor


def run_finished(output_dir: Path) -> bool:
    """Whether the run in ``output_dir`` ended (its summary is in metrics.jsonl) or saved an actor there."""
    if any((output_dir / name).exists() for name in SAVED_ACTOR):
        return True
    metrics = output_dir / RUN_LOGS[0]
    if not metrics.is_file():
        return False
    with open(metrics, "rb") as f:
        return any(SUMMARY_KEY in line for line in f)


def refuse_other_runs(
    output_dir: str | os.PathLike, checkpoint: Path | None, overwrite: bool, resuming: bool = False
) -> None:
    """Before a run starts from ``checkpoint`` (None: from step 0; ``resuming``: resume_from_checkpoint=True found
    no checkpoint) in ``output_dir`` (main process, under the lock): refuse another run's checkpoints, logs or
    saved actor, or with ``overwrite`` delete its checkpoints and logs."""
    output_dir = Path(output_dir)
    if checkpoint is not None and checkpoint.resolve().parent == output_dir.resolve():
        return  # its own lineage: newer checkpoints are moved aside once the checkpoint has loaded
    existing = checkpoint_dirs(output_dir)
    start = "A fresh start" if checkpoint is None else f"Resuming from {checkpoint}, outside it,"
    if existing and not overwrite:
        names = ", ".join(path.name for _, path in existing)
        raise CheckpointError(
            f"output_dir={str(output_dir)!r} holds checkpoints of another run ({names}). {start} would mix with "
            "them: rotation would delete this run's checkpoints and resume_from_checkpoint=True would pick up "
            "theirs. Continue that run with resume_from_checkpoint=True, delete them with overwrite_output_dir=True, "
            "or use another output_dir."
        )
    if not existing and not overwrite and (left := run_leftovers(output_dir)):
        refuse_run_without_checkpoints(output_dir, left, start, resuming and checkpoint is None)
    if output_dir.is_dir() and (removed := remove_checkpoints(output_dir)):
        why = "overwrite_output_dir=True" if existing else "partial checkpoints of a run stopped in its first save"
        logger.warning(f"Deleted {', '.join(removed)} from {output_dir} before starting ({why}).")
    if overwrite and (logs := [name for name in RUN_LOGS if (output_dir / name).is_file()]):
        for name in logs:
            (output_dir / name).unlink()
        logger.warning(f"Deleted {', '.join(logs)} from {output_dir} before starting (overwrite_output_dir=True).")


def refuse_run_without_checkpoints(output_dir: Path, left: list[str], start: str, resuming: bool) -> None:
    """``output_dir`` holds a run's logs or saved actor but no checkpoint: refuse to start over it, except where
    ``resume_from_checkpoint=True`` continues a run stopped before its first save (from step 0)."""
    listed = ", ".join(left)
    if resuming and not run_finished(output_dir):
        logger.warning(
            f"{output_dir} holds a run stopped before its first checkpoint ({listed}): "
            "resume_from_checkpoint=True starts it again from step 0."
        )
        return
    if resuming:
        start = "resume_from_checkpoint=True finds no checkpoint to continue it from, and starting from step 0"
    harm = [
        what
        for what, names in (("truncate its logs", RUN_LOGS), ("overwrite its saved actor", SAVED_ACTOR))
        if any(name.rstrip("/") in names for name in left)
    ]
    raise CheckpointError(
        f"output_dir={str(output_dir)!r} holds a run without checkpoints ({listed}). {start} would "
        f"{' and '.join(harm)}. Pass overwrite_output_dir=True to replace that run (its logs are deleted first), or "
        "use another output_dir."
    )


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
        logger.warning(
            f"Resumed from {checkpoint.name}: moved the newer {', '.join(p.name for p in newer)} to "
            f"{aside} (nothing is deleted)."
        )
