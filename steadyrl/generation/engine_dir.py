"""The directory an in-process vLLM engine is created from (the actor's config and tokenizer), in the system temp dir.

A killed run cannot remove its directory, so the next engine started on the machine removes those whose run is gone.
Each run holds an exclusive ``flock`` on its directory's ``lock`` file while its engine lives; the kernel drops it
when the process ends, however it ends. A lock that can be taken therefore belongs to a run that is gone, and a live
run's directory is never removed, whatever its process id or namespace.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import weakref

logger = logging.getLogger(__name__)

PREFIX = "steadyrl-vllm-"
LOCK = "lock"


def remove_stale(root: str | None = None) -> list[str]:
    """Remove the ``steadyrl-vllm-*`` directories of ``root`` (the temp dir) whose run is gone; return their paths.
    A directory without a ``lock`` file (one being made, or an older steadyrl's) is left alone."""
    root = root or tempfile.gettempdir()
    removed = []
    for entry in os.scandir(root):
        if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, LOCK)) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its run lives
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue
        removed.append(entry.path)
    if removed:
        logger.info("Removed %d vLLM engine directories left by killed runs: %s", len(removed), ", ".join(removed))
    return removed


def _remove(path: str, lock) -> None:
    shutil.rmtree(path, ignore_errors=True)  # while still locked: no other run removes it at the same time
    lock.close()


class EngineDir:
    """A new ``steadyrl-vllm-*`` directory in ``root`` (the temp dir), locked as this run's until ``cleanup()`` or
    the end of the process; stale ones are removed first."""

    def __init__(self, root: str | None = None) -> None:
        remove_stale(root)
        self.name = tempfile.mkdtemp(prefix=PREFIX, dir=root)
        pending = os.path.join(self.name, LOCK + ".pending")
        lock = open(pending, "w")  # noqa: SIM115 - held open (locked) as long as the directory lives
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(pending, os.path.join(self.name, LOCK))  # under its name only once locked
        self._finalizer = weakref.finalize(self, _remove, self.name, lock)

    def cleanup(self) -> None:
        self._finalizer()
