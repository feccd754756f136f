"""Taking a run's ``output_dir`` before training: its lock, the commits a crash interrupted, the checkpoint
``resume_from_checkpoint`` names, and whether every process sees the same directory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from accelerate.utils import gather_object
from transformers.utils import logging

from ..distributed.processes import on_main_process
from ..ops.finite import first_names
from . import CheckpointError, find_resumable_checkpoint, recover_interrupted_commits, verify_checkpoint
from .health import nonfinite_in_checkpoint
from .ownership import OutputDirLock, refuse_other_runs
from .shared_dir import create_marker, not_shared_error, remove_marker, view_of

logger = logging.get_logger(__name__)

TRUE_VALUES, FALSE_VALUES = {"true", "yes", "1", "latest"}, {"false", "no", "0", "none", ""}


def asks_for_newest(value) -> bool:
    """Whether ``resume_from_checkpoint`` asks for the newest complete checkpoint of output_dir."""
    return value is True or (isinstance(value, str) and value.strip().lower() in TRUE_VALUES)


def find_checkpoint(value, output_dir: str) -> Path | None:
    """Turn ``resume_from_checkpoint`` (bool, "true"/"false", or a path) into a verified directory or None."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in FALSE_VALUES):
        return None
    if asks_for_newest(value):
        found = find_resumable_checkpoint(output_dir)
        if found is None:
            logger.warning(f"No complete checkpoint in {output_dir}: starting from step 0.")
        return found
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"resume_from_checkpoint={value!r} is invalid: use True (the newest complete checkpoint in "
            "output_dir), False, or the path of a checkpoint-N directory."
        )
    path = Path(value)
    if not path.is_dir():
        raise CheckpointError(f"resume_from_checkpoint={value!r} is not a directory.")
    verify_checkpoint(path)
    poisoned = nonfinite_in_checkpoint(path)
    if poisoned:
        raise CheckpointError(
            f"resume_from_checkpoint={value!r} holds NaN or infinite values ({first_names(poisoned, 3)}): "
            "training from it would spread them. Resume from an older checkpoint, or with resume_from_checkpoint=True "
            "(the newest one that is finite)."
        )
    return path


def take_output_dir(value, args, accelerator) -> tuple[OutputDirLock | None, Path | None]:
    """Lock ``output_dir`` (main process), finish the commits a crash interrupted, find the checkpoint
    ``resume_from_checkpoint`` names, and refuse (or with ``overwrite_output_dir`` delete) another run's
    checkpoints (ownership.py); every process gets the checkpoint or the error."""
    lock = OutputDirLock(args.output_dir) if accelerator.is_main_process else None
    on_main_process(accelerator, lock.acquire if lock else None)

    def resolve() -> Path | None:
        for action in recover_interrupted_commits(args.output_dir):
            logger.warning(action)
        checkpoint = find_checkpoint(value, args.output_dir)
        refuse_other_runs(args.output_dir, checkpoint, args.overwrite_output_dir, asks_for_newest(value))
        return checkpoint

    try:
        check_shared_output_dir(args.output_dir, accelerator)
        checkpoint = on_main_process(accelerator, resolve)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if checkpoint is not None:
        logger.warning(f"Resuming from {checkpoint}.")  # every process: each says what it loads
    return lock, checkpoint


@contextlib.contextmanager
def output_dir_locked(output_dir: str, accelerator) -> Iterator[None]:
    """``output_dir``'s lock (main process) for work outside ``train()`` that writes there or into the run's vLLM
    server (``evaluate()``); ``OutputDirInUse`` on every process while another run holds it."""
    lock = OutputDirLock(output_dir) if accelerator.is_main_process else None
    on_main_process(accelerator, lock.acquire if lock else None)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def check_shared_output_dir(output_dir: str, accelerator) -> None:
    """Every process must see the one ``output_dir`` the main process writes checkpoints in (on several machines: a
    shared filesystem): the main process creates a new file there and every process looks for it
    (shared_dir.py). Raises OutputDirNotShared on every process otherwise."""
    if accelerator.num_processes == 1:
        return
    marker = on_main_process(accelerator, lambda: create_marker(output_dir))
    views = gather_object([view_of(output_dir, marker, accelerator.process_index)])  # also a barrier
    if accelerator.is_main_process:
        remove_marker(output_dir, marker)
    error = not_shared_error(output_dir, views)
    if error is not None:
        raise error
