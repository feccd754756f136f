"""The embedded toy task (``task``), its reward model (``reward_model``) and the demo (``demo``).

Tests, benchmarks, the demo and ``steadyrl <algorithm> --toy`` use it; the trainers never import it.
"""

from .reward_model import toy_reward_model_path
from .task import (
    CHARACTERS,
    COMPLETION_LENGTH,
    NUM_PROMPTS,
    build_cached,
    build_model,
    build_tokenizer,
    cache_dir,
    letters_reward,
    toy_dataset,
    toy_model_path,
)

__all__ = [
    "CHARACTERS",
    "COMPLETION_LENGTH",
    "NUM_PROMPTS",
    "build_cached",
    "build_model",
    "build_tokenizer",
    "cache_dir",
    "letters_reward",
    "toy_dataset",
    "toy_model_path",
    "toy_reward_model_path",
]
