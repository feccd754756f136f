"""Artefacts steadyrl builds once and keeps on disk (the toy models, the real-model fixture, benchmark models) and
the vLLM server keys: one directory, below every other module."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """Where built artefacts live (``$STEADYRL_CACHE`` or ``~/.cache/steadyrl``)."""
    root = os.environ.get("STEADYRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "steadyrl")
    return Path(root)


def build_cached(name: str, build: Callable[[Path], None]) -> str:
    """``build(staging_dir)`` once into ``cache_dir()/name``; its path. Parallel callers wait for the one that
    builds (a file lock), and a killed build leaves nothing under the final name (built aside, then renamed)."""
    target = cache_dir() / name
    if (target / "config.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():  # built while this process waited
            return str(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-build-", dir=target.parent))
        try:
            build(staging)
            shutil.rmtree(target, ignore_errors=True)  # a copy without config.json is unfinished
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)
