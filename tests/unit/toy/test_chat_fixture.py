"""The embedded chat fixture (steadyrl.toy.chat): a tiny Qwen2 chat model with a ChatML template, built offline, and
the conversational dataset shipped in the package."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
from trl.rewards import think_format_reward

from steadyrl.toy import CHAT_TEMPLATE, build_chat_tokenizer, chat_dataset, chat_model_path, letters_in_answer
from steadyrl.toy.chat import DATA_DIR, chat_rows

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Spell with the letters of: qzvk"}


@pytest.fixture(scope="module")
def chat_path() -> str:
    return chat_model_path()


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize(
    "messages, text",
    [
        ([USER], "<|im_start|>user\nSpell with the letters of: qzvk<|im_end|>\n<|im_start|>assistant\n"),
        (
            [SYSTEM, USER],
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nSpell with the letters of: qzvk<|im_end|>\n<|im_start|>assistant\n",
        ),
    ],
)
def test_template_renders_chatml_and_tokenizes_one_token_per_character(messages, text):
    tokenizer = build_chat_tokenizer()
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == text
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == tokenizer(text)["input_ids"]
    special = [tokenizer.convert_tokens_to_ids(t) for t in ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]]
    assert special == [0, 1, 2, 3] and tokenizer.eos_token_id == 3 and tokenizer.pad_token_id == 0
    plain = text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert len(ids) == len(plain) + 2 * text.count("<|im_start|>") - 1  # the generation prompt has no <|im_end|>
    assert tokenizer.decode(ids, skip_special_tokens=True) == plain


def test_saved_tokenizer_loads_the_same_with_auto_tokenizer(chat_path):
    built = build_chat_tokenizer()
    loaded = [AutoTokenizer.from_pretrained(chat_path), PreTrainedTokenizerFast.from_pretrained(chat_path)]
    texts = ["<think>\nabc\n</think>\nabc", "Hi!  (1+2=3?) 'a' \"b\" <x/>\n\n:-.", "<|im_start|>user\nhi<|im_end|>"]
    for tokenizer in loaded:
        assert isinstance(tokenizer, PreTrainedTokenizerFast) and len(tokenizer) == len(built) == 100
        assert tokenizer.chat_template == CHAT_TEMPLATE and tokenizer.eos_token == "<|im_end|>"
        ids = tokenizer(texts)["input_ids"]
        assert ids == built(texts)["input_ids"]
        assert tokenizer.batch_decode(ids, skip_special_tokens=True) == texts[:2] + ["user\nhi"]
        assert tokenizer.batch_decode(ids) == texts


def test_model_generates_and_stops_at_im_end(chat_path):
    tokenizer = AutoTokenizer.from_pretrained(chat_path)
    model = AutoModelForCausalLM.from_pretrained(chat_path)
    config = model.config
    assert config.model_type == "qwen2" and config.hidden_size // config.num_attention_heads == 32  # vLLM's CPU kernels
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    prompts = list(chat_dataset("eval")["prompt"])
    inputs = tokenizer.apply_chat_template(
        prompts, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**inputs, do_sample=False, max_new_tokens=64)
    completions = output[:, inputs["input_ids"].shape[1] :]
    assert completions.shape[1] < 64  # every row stopped
    for row in completions.tolist():
        end = row.index(tokenizer.eos_token_id)
        assert set(row[end + 1 :]) <= {tokenizer.pad_token_id}, row


def test_dataset_ships_two_splits_of_conversational_prompts():
    train, evaluation = chat_dataset("train"), chat_dataset("eval")
    assert (len(train), len(evaluation)) == (64, 16)
    assert train.column_names == ["prompt", "letters"]
    for row in [*train, *evaluation]:
        assert [m["role"] for m in row["prompt"]] in (["user"], ["system", "user"])
        assert row["letters"] in row["prompt"][-1]["content"]
    assert 20 <= sum(len(row["prompt"]) == 2 for row in train) <= 44
    assert not set(train["letters"]) & set(evaluation["letters"])
    for split in ("train", "eval"):  # the files are what the generator writes (see steadyrl/toy/chat.py to rewrite)
        lines = (DATA_DIR / f"chat_{split}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == chat_rows(split)
    with pytest.raises(ValueError, match="split='test' is invalid"):
        chat_dataset("test")


@pytest.mark.parametrize(
    "text, letters, reward",
    [
        ("qzvkqzvk", "qzvk", 1.0),
        ("<think>\nhmm\n</think>\nqzvkqzvk", "qzvk", 1.0),  # the think block does not count
        ("<think>\nqzvk\n</think>\nab", "qzvk", 0.0),
        ("qz", "qzvk", 0.25),  # over a fixed length of 8
        ("qzvk abcdef", "qzvk", 0.5),  # only the first 8 characters count
        ("<think>\nqzvx", "qzvx", 0.0),  # an unclosed think block is answer text: "<think>\n" scores 0
    ],
)
def test_letters_in_answer(text, letters, reward):
    assert letters_in_answer([assistant(text)], [letters]) == [reward]


def test_trl_think_format_reward_reads_this_tokenizers_completions():
    tokenizer = build_chat_tokenizer()
    ids = tokenizer("<think>\nthe letters\n</think>\nqzvk<|im_end|>")["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert think_format_reward([assistant(text), assistant("qzvk")]) == [1.0, 0.0]
    assert letters_in_answer([assistant(text)], ["qzvk"]) == [0.5]
