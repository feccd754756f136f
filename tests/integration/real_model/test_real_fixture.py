"""The real-model fixture (steadyrl.real): SmolLM2-135M-Instruct converted from its registry package into a plain
float32 checkpoint, atomically; the arithmetic task's data and rewards."""

import signal
import subprocess
import sys

import pytest
from conftest import ROOT
from transformers import AutoConfig, AutoTokenizer

from steadyrl.cache import build_cached
from steadyrl.real import answer_format, arithmetic_dataset, correct_answer, final_number, smollm2_path

KILLED_BUILD = """
import os, signal, sys
sys.path.insert(0, {root!r})
from steadyrl.cache import build_cached

def build(directory):
    (directory / "config.json").write_text("{{}}")  # what marks a finished build, then killed before the rest
    os.kill(os.getpid(), signal.SIGKILL)

build_cached("model", build)
"""


def test_a_killed_conversion_leaves_nothing_a_later_call_uses(tmp_path, monkeypatch):
    """The conversion is written aside and renamed into place (steadyrl.cache.build_cached)."""
    monkeypatch.setenv("STEADYRL_CACHE", str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", KILLED_BUILD.format(root=str(ROOT))])
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "model").exists(), "a killed build must not appear under its final name"
    built = build_cached("model", lambda d: (d / "config.json").write_text('{"complete": true}'))
    assert built == str(tmp_path / "model") and (tmp_path / "model" / "config.json").read_text() == '{"complete": true}'


def test_the_converted_model_is_a_plain_float32_checkpoint_with_the_chat_template():
    path = smollm2_path()
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "llama" and config.vocab_size == 49152 and config.hidden_size == 576
    assert not hasattr(config, "quantization_config") and str(config.dtype) in ("float32", "torch.float32")
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"), text
    assert tokenizer.eos_token == "<|im_end|>"


def test_arithmetic_splits_are_deterministic_disjoint_and_correct():
    train, held_out = arithmetic_dataset("train"), arithmetic_dataset("eval")
    assert len(train) == 4096 and len(held_out) == 128
    assert arithmetic_dataset("train")["prompt"] == train["prompt"], "the same data for the same arguments"
    questions = {p[-1]["content"] for p in train["prompt"]}
    assert len(questions) == len(train) and not questions & {p[-1]["content"] for p in held_out["prompt"]}
    for prompt, answer in zip(held_out["prompt"], held_out["answer"]):
        a, b = map(int, prompt[-1]["content"].removeprefix("What is ").removesuffix("?").split(" + "))
        assert 10 <= a <= 99 and 10 <= b <= 99 and int(answer) == a + b
    three = arithmetic_dataset("eval", size=4, digits=3)
    assert all(len(p[-1]["content"].split()[2]) == 3 for p in three["prompt"])
    with pytest.raises(ValueError, match="split='test' is invalid"):
        arithmetic_dataset("test")
    with pytest.raises(ValueError, match="only 61 distinct 1-digit additions"):
        arithmetic_dataset("train", size=100, digits=1)


def test_rewards_read_the_replys_last_number_and_its_form():
    replies = ["47 + 38 = 85", "85", "To add 47 and 38, we need", "The answer is 85.", "85 or 86"]
    completions = [[{"role": "assistant", "content": text}] for text in replies]
    assert correct_answer(completions, answer=["85"] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert answer_format(completions) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert correct_answer(replies, answer=["85"] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0], "plain-text completions too"
    assert final_number("no number") is None


def test_the_weight_digest_samples_a_real_embedding_up_to_its_last_element():
    """An embedding of SmolLM2's shape, 49,152 x 576 = 28,311,552 elements (past 2**24, where float32 index steps
    round past the end): every trainer crashed at construction computing this digest."""
    import torch

    from steadyrl.checkpoint.fingerprint import evenly_spaced, weights_digest

    size = 49152 * 576
    index = evenly_spaced(size, 64)
    assert index.dtype == torch.int64 and index[0] == 0 and index[-1] == size - 1 and len(set(index.tolist())) == 64
    embedding = torch.nn.Embedding(49152, 576, _weight=torch.zeros(49152, 576))
    before = weights_digest(embedding)
    with torch.no_grad():
        embedding.weight[-1, -1] = 1.0  # the last element is one of the sampled values
    assert weights_digest(embedding) != before
