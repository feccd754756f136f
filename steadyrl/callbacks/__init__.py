"""Callbacks that hold steadyrl's step and checkpoint invariants; usable with a plain Trainer too."""

from .checkpoint import CheckpointCallback
from .global_step import GlobalStepCallback, GlobalStepError
from .progress import RLProgressCallback

__all__ = ["CheckpointCallback", "GlobalStepCallback", "GlobalStepError", "RLProgressCallback"]
