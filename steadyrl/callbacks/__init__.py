"""Callbacks that keep global_step moving by exactly one per update and checkpoints on the save_steps grid; usable
with a plain Trainer too."""

from .global_step import GlobalStepCallback, GlobalStepError
from .progress import RLProgressCallback
from .save_steps import CheckpointCallback

__all__ = ["CheckpointCallback", "GlobalStepCallback", "GlobalStepError", "RLProgressCallback"]
