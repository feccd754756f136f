"""Generation backends behind one interface."""

from .base import GenerationBackend, SamplingSettings
from .hf import HFGenerationBackend

__all__ = ["GenerationBackend", "HFGenerationBackend", "SamplingSettings"]
