"""Whether every process of a run sees the same ``output_dir``.

Each process writes its own files (RNG state, optimizer partition, share of the rollout) into the checkpoint that
the main process then hashes and commits, so on several machines ``output_dir`` must be one directory on a
filesystem they all mount. Without one, each machine would see a directory of its own disk, and the other machines'
processes would fail at the first save (there is no ``tmp-checkpoint-N`` on their disk), after training up to it.

So before training the main process creates a file under a name never used before (no filesystem cache can hold
an answer for it) and every process looks for it; a process that cannot see it stops the run, naming the
directory and the hosts.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

MARKER_PREFIX = ".steadyrl-shared-"
NAMED = 4  # processes named in the error; the rest are counted


class OutputDirNotShared(ValueError):
    """The processes of a run do not all see one ``output_dir``."""


@dataclass(frozen=True)
class DirectoryView:
    """What one process sees of ``output_dir``: where it resolves and whether the main process's marker is there."""

    rank: int
    host: str
    path: str
    sees_marker: bool


def create_marker(output_dir: str | os.PathLike) -> str:
    """Main process: create a new marker file in ``output_dir`` (flushed to the filesystem); return its name."""
    name = MARKER_PREFIX + secrets.token_hex(8)  # os.urandom: the run's random streams are left alone
    with open(Path(output_dir) / name, "x") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid()}, f)
        f.flush()
        os.fsync(f.fileno())
    return name


def view_of(output_dir: str | os.PathLike, marker: str, rank: int) -> DirectoryView:
    """This process's view of ``output_dir``: does it hold the marker the main process created?"""
    seen = (Path(output_dir) / marker).is_file()
    return DirectoryView(rank, socket.gethostname(), os.path.abspath(output_dir), seen)


def remove_marker(output_dir: str | os.PathLike, marker: str) -> None:
    (Path(output_dir) / marker).unlink(missing_ok=True)


def not_shared_error(output_dir: str | os.PathLike, views: list[DirectoryView]) -> OutputDirNotShared | None:
    """The error to raise on every process when some process did not see the marker (``views[0]`` is the main
    process's, which created it); None when all did."""
    main, blind = views[0], [view for view in views if not view.sees_marker]
    if not blind:
        return None
    named = ", ".join(f"process {v.rank} on host {v.host}" for v in blind[:NAMED])
    if len(blind) > NAMED:
        named += f" and {len(blind) - NAMED} more"
    resolved = ""
    if blind[0].path != main.path:  # a relative output_dir under different working directories
        resolved = (
            f" (it resolves to {main.path} on process {main.rank} but to {blind[0].path} on process {blind[0].rank})"
        )
    return OutputDirNotShared(
        f"output_dir={str(output_dir)!r} is not one directory shared by every process{resolved}: process "
        f"{main.rank} on host {main.host} created a file in it that {named} cannot see. Every process writes its "
        "part of each checkpoint into that directory, so on several machines output_dir must be on a filesystem "
        "all of them mount (NFS, Lustre, ...), at the same path: an absolute one, or relative to the same working "
        "directory. Nothing was trained."
    )
