"""fsync_dir (steadyrl/durable.py): the directory itself is synced, so that a new or renamed file's entry survives a
crash, and its descriptor is closed (a checkpoint syncs every directory it writes, run after run)."""

from __future__ import annotations

import os

import pytest

from steadyrl import durable


def test_the_directory_is_synced_and_its_descriptor_closed(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    open_before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        durable.fsync_dir(tmp_path)
    assert synced == [tmp_path.stat().st_ino] * 20
    assert len(os.listdir("/proc/self/fd")) == open_before, "fsync_dir leaked a file descriptor"


def test_a_missing_directory_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        durable.fsync_dir(tmp_path / "missing")
