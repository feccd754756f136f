"""What a failed checkpoint save says: why (a full disk, a read-only filesystem, a denied permission, or the
error itself), what still stands, and what to do."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from ..ops.finite import NonFiniteError
from . import newest_intact_checkpoint


def os_error_in(err: BaseException) -> OSError | None:
    """The first ``OSError`` with an errno in ``err``'s chain (itself, then its ``__cause__`` or ``__context__``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


FULL_DISK = {errno.ENOSPC: "", errno.EDQUOT: ", but the disk quota is used up"}
NOT_WRITABLE = {  # errno: (what it means, what to do)
    errno.EROFS: (
        "its filesystem is read-only",
        "Point output_dir at a writable filesystem (or remount this one read-write)",
    ),
    errno.EACCES: ("permission denied", "Give this process write permission on output_dir (or point it elsewhere)"),
}
NOT_WRITABLE[errno.EPERM] = NOT_WRITABLE[errno.EACCES]
RESUME = "and run again with resume_from_checkpoint=True."


FIND = "find"  # save_failure_message's default: look at output_dir


def save_failure_message(tmp: Path, err: Exception, newest: Path | None | str = FIND, left: bool | None = None) -> str:
    """Why writing ``tmp`` failed (a full disk, a read-only filesystem, a denied permission, or the error itself),
    what still stands (``newest``: the newest intact checkpoint, or None; ``left``: whether ``tmp`` could not be
    removed; each looked up here, without hashing, unless given), and what to do: freeing space is advised only
    for a full disk."""
    if newest == FIND:
        newest = newest_intact_checkpoint(tmp.parent)
    kept = f"the newest complete checkpoint, {newest}, is intact" if newest else "no earlier checkpoint exists"
    left = tmp.exists() if left is None else left
    partial = "could not be removed (it is never resumed from)" if left else "was removed"
    if isinstance(err, NonFiniteError):  # refused, not failed: nothing about the disk to say
        return (
            f"{err} The checkpoint {tmp} was not written and {kept}: no checkpoint ever holds a non-finite number. "
            "Something changed the weights outside the optimizer step, which refuses non-finite updates (a callback, "
            "a weight sync): fix it, then resume with resume_from_checkpoint=True."
        )
    failure = f"Could not write the checkpoint {tmp} ({type(err).__name__}: {err})"
    cause = os_error_in(err)
    code = cause.errno if cause is not None else None
    if code in NOT_WRITABLE:
        meaning, advice = NOT_WRITABLE[code]
        return f"{failure}: {meaning}. The partial directory {partial} and {kept}. {advice} {RESUME}"
    try:
        free_bytes = shutil.disk_usage(tmp.parent).free
        free = f"{free_bytes / 2**20:.0f} MiB"
    except OSError:
        free_bytes, free = None, "unknown"
    if code is None and free_bytes is not None and newest and free_bytes < directory_size(newest):
        # a writer that reports no errno (torch's zip writer: "unexpected pos"), with less room than a checkpoint takes
        code = errno.ENOSPC
        free += f", less than the {directory_size(newest) / 2**20:.0f} MiB a checkpoint takes"
    if code in FULL_DISK:
        return (
            f"{failure}; free space on its filesystem: {free}{FULL_DISK[code]}. The partial directory {partial} and "
            f"{kept}. Free some space (or point output_dir elsewhere) {RESUME}"
        )
    return (
        f"{failure}; free space on its filesystem: {free}. The partial directory {partial} and {kept}. Fix the cause "
        f"of this error {RESUME}"
    )


def directory_size(directory: Path) -> int:
    """The bytes of the files below ``directory``."""
    return sum(path.stat().st_size for path in Path(directory).rglob("*") if path.is_file())
