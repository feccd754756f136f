"""Checkpoint files: manifests, atomic directories, discovery, rotation, RNG state, run ownership."""

from .files import (
    begin_checkpoint,
    checkpoint_name,
    commit_checkpoint,
    find_resumable_checkpoint,
    newest_intact_checkpoint,
    recover_interrupted_commits,
    rotate_checkpoints,
    scan_checkpoints,
)
from .manifest import CheckpointError, verify_checkpoint, write_manifest

__all__ = [
    "CheckpointError",
    "begin_checkpoint",
    "checkpoint_name",
    "commit_checkpoint",
    "find_resumable_checkpoint",
    "newest_intact_checkpoint",
    "recover_interrupted_commits",
    "rotate_checkpoints",
    "scan_checkpoints",
    "verify_checkpoint",
    "write_manifest",
]
