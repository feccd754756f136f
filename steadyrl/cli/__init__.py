"""The ``steadyrl`` command line: training, serving, checkpoints, export and push."""

from .main import main

__all__ = ["main"]
