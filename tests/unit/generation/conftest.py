"""Fixtures of the HF generation tests: a tiny model whose next token depends on the prompt, and its tokenizer."""

import pytest

from steadyrl.toy.task import build_model, build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    """A tiny Qwen2 with large initial weights, so that its next token depends on the prompt."""
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
    return build_model(tokenizer, seed=3, num_key_value_heads=1, initializer_range=0.3, **small).eval()
