"""The embedded toy task (``task``), its reward model (``reward_model``), the demo (``demo``), and a tiny chat model
with a conversational dataset (``chat``).

Tests, benchmarks, the demo and ``steadyrl <algorithm> --toy`` use it; the trainers never import it.
"""

from .chat import (
    ANSWER_LENGTH,
    CHAT_TEMPLATE,
    build_chat_tokenizer,
    chat_dataset,
    chat_model_path,
    letters_in_answer,
    untrained_chat_model_path,
)
from .reward_model import toy_reward_model_path
from .task import (
    CHARACTERS,
    COMPLETION_LENGTH,
    NUM_PROMPTS,
    build_model,
    build_tokenizer,
    letters_reward,
    toy_dataset,
    toy_model_path,
)

__all__ = [
    "ANSWER_LENGTH",
    "CHAT_TEMPLATE",
    "CHARACTERS",
    "COMPLETION_LENGTH",
    "NUM_PROMPTS",
    "build_chat_tokenizer",
    "build_model",
    "build_tokenizer",
    "chat_dataset",
    "chat_model_path",
    "letters_in_answer",
    "letters_reward",
    "toy_dataset",
    "toy_model_path",
    "toy_reward_model_path",
    "untrained_chat_model_path",
]
