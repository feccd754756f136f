"""Callbacks that keep global_step moving by exactly one per update and checkpoints on the save_steps grid; usable
with a plain Trainer too."""

from .checkpoint import CheckpointCallback
from .global_step import GlobalStepCallback, GlobalStepError
from .progress import RLProgressCallback

__all__ = ["CheckpointCallback", "GlobalStepCallback", "GlobalStepError", "RLProgressCallback"]
