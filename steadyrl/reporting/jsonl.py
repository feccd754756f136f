"""Append-only JSON-lines files keyed by global step (completions.jsonl, metrics.jsonl): durable appends, and
truncation to a checkpoint's step when a run resumes, so a resumed run's file equals an uninterrupted run's."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..durable import fsync_dir


def append_records(path: Path, records: list[dict]) -> None:
    """Append one JSON line per record, flushed and fsynced: a checkpoint written after this call never refers to
    lines that a crash could lose."""
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(lines)
        f.flush()
        os.fsync(f.fileno())
    if created:
        fsync_dir(path.parent)


def truncate_after(path: Path, step: int) -> None:
    """Drop the lines of steps after ``step``, and a partly written last line: what a run killed after its last
    checkpoint wrote. Rewritten atomically, and only if something is dropped."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        if all(_line_is_kept(line, step) for line in f):
            return
    tmp = path.with_name(path.name + ".tmp")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        dst.writelines(line for line in src if _line_is_kept(line, step))
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _line_is_kept(line: bytes, step: int) -> bool:
    if not line.endswith(b"\n"):  # cut short by a kill
        return False
    try:
        return int(json.loads(line)["step"]) <= step
    except (ValueError, KeyError, TypeError):
        return False
