"""The embedded toy task: a tiny Qwen2 model, a character tokenizer, prompts and a rule reward.

Everything is built deterministically and offline, then cached on disk, so tests and the demo
never download anything. The task: a prompt is a short lowercase word followed by ``:``; the
reward is the fraction of the ``completion_length`` characters after it that are letters of that
word. A randomly initialised model scores about 0.1; copying prompt letters scores 1.0.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from pathlib import Path

from ..cache import build_cached

TOY_VERSION = 1
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARACTERS = string.ascii_lowercase + string.digits + " :=+-.,"
MODEL_CONFIG = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,  # head_dim 32: vLLM's CPU attention kernels refuse 16
    num_key_value_heads=4,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
NUM_PROMPTS = 512
COMPLETION_LENGTH = 12


def build_tokenizer():
    """A character-level WordLevel tokenizer that transformers and vLLM both accept."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + list(CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )


def build_model(tokenizer, seed: int = 0, **config_overrides):
    """A freshly initialised Qwen2 causal LM sized for the toy vocabulary (~3M parameters, or as overridden)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**MODEL_CONFIG, **config_overrides},
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id
    )
    return model


def _fingerprint() -> str:
    spec = json.dumps([TOY_VERSION, SPECIAL_TOKENS, CHARACTERS, MODEL_CONFIG], sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def toy_model_path() -> str:
    """Build the toy model and tokenizer once; return its directory."""

    def build(directory: Path) -> None:
        tokenizer = build_tokenizer()
        build_model(tokenizer).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return build_cached(f"toy-model-{_fingerprint()}", build)


def toy_dataset(num_prompts: int = NUM_PROMPTS, seed: int = 0):
    """Prompts ``"<word>:"`` with the word's letters in a ``letters`` column."""
    from datasets import Dataset

    rng = random.Random(seed)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6))) for _ in range(num_prompts)]
    return Dataset.from_dict({"prompt": [f"{w}:" for w in words], "letters": words})


def letters_reward(completions: list[str], letters: list[str], **kwargs) -> list[float]:
    """Fraction of the first ``COMPLETION_LENGTH`` completion characters that are letters of the prompt word."""
    return [
        sum(ch in set(word) for ch in completion[:COMPLETION_LENGTH]) / COMPLETION_LENGTH
        for completion, word in zip(completions, letters)
    ]
