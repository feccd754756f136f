"""The embedded chat fixture: a tiny Qwen2 chat model with a ChatML template, and a small conversational dataset.

The task is the toy task asked in words: the user names a short word and asks for an answer made of its letters;
``letters_in_answer`` scores the answer that follows an optional ``<think>...</think>`` block. The model is built
offline (deterministically) and cached like the toy model, then taught the reply format for 600 steps on
random answers: it ends its turns with ``<|im_end|>`` and often thinks first, but its letters are random, so its
reward starts low (about 0.1) and RL has the task to learn. The dataset ships in ``data/`` as JSON Lines, written
by ``write_chat_data`` from the seeded generator ``chat_rows``; to regenerate it after changing the generator:
``python -c "from steadyrl.toy.chat import write_chat_data; write_chat_data()"``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
from pathlib import Path

from ..cache import build_cached

CHAT_VERSION = 1
SPECIAL_TOKENS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2, 3
CHARACTERS = string.ascii_letters + string.digits + string.punctuation + " \n"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MODEL_CONFIG = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,  # head_dim 32: vLLM's CPU attention kernels refuse 16
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
FORMAT_TRAINING = dict(steps=600, batch_size=16, learning_rate=2e-3, seed=0)
ANSWER_LENGTH = 8
DATA_DIR = Path(__file__).parent / "data"
SPLIT_SIZES = {"train": 64, "eval": 16}

SYSTEM_MESSAGES = [
    "You are a helpful assistant.",
    "Answer with lowercase letters only.",
    "Think first, then give a short answer.",
    "You spell words with their own letters.",
]
USER_MESSAGES = [
    "Spell with the letters of: {word}",
    'Answer using only the letters of "{word}".',
    "Which letters make up {word}? Reply with them.",
    "Write a short string made of the letters in '{word}'.",
]
_THINK_BLOCK = re.compile(r"\s*<think>.*?</think>", re.DOTALL)


def build_chat_tokenizer():
    """One token per character, plus ``<pad> <unk> <|im_start|> <|im_end|>``; eos ``<|im_end|>``, ChatML template.

    Built as a ``Qwen2Tokenizer`` (byte-level BPE) without merges: it is the class ``AutoTokenizer`` and vLLM pick for
    a qwen2 model whatever ``tokenizer_config.json`` says, and it rebuilds its pipeline from the vocabulary, so a
    tokenizer of any other kind would load differently (a WordLevel one loses its spaces and newlines). Characters
    outside ``CHARACTERS`` are dropped, as Qwen2Tokenizer drops any unknown byte.
    """
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    symbols = [byte_level.pre_tokenize_str(ch)[0][0] for ch in CHARACTERS]  # " " is "Ġ", "\n" is "Ċ"
    tokenizer = Qwen2Tokenizer(
        vocab={token: i for i, token in enumerate(SPECIAL_TOKENS + symbols)},
        merges=[],
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        extra_special_tokens=["<|im_start|>"],
        padding_side="left",
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def chat_rows(split: str) -> list[dict]:
    """The rows of ``split`` as shipped in ``data/chat_<split>.jsonl``: seeded, distinct words across both splits."""
    _check_split(split)
    rng = random.Random(0)
    words: list[str] = []
    while len(words) < sum(SPLIT_SIZES.values()):
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6)))
        if word not in words:
            words.append(word)
    rows = [{"prompt": _messages(rng, word), "letters": word} for word in words]
    return rows[: SPLIT_SIZES["train"]] if split == "train" else rows[SPLIT_SIZES["train"] :]


def _check_split(split: str) -> None:
    if split not in SPLIT_SIZES:
        raise ValueError(f"split={split!r} is invalid: use one of {list(SPLIT_SIZES)}.")


def _messages(rng: random.Random, word: str) -> list[dict[str, str]]:
    system = [{"role": "system", "content": rng.choice(SYSTEM_MESSAGES)}] if rng.random() < 0.5 else []
    return system + [{"role": "user", "content": rng.choice(USER_MESSAGES).format(word=word)}]


def write_chat_data(directory: Path = DATA_DIR) -> None:
    """Write ``chat_rows`` of each split to ``directory/chat_<split>.jsonl``, one JSON object a line."""
    directory.mkdir(parents=True, exist_ok=True)
    for split in SPLIT_SIZES:
        lines = [json.dumps(row) + "\n" for row in chat_rows(split)]
        (directory / f"chat_{split}.jsonl").write_text("".join(lines))


def chat_dataset(split: str = "train"):
    """The shipped conversational prompts of ``split`` ("train": 64 rows, "eval": 16) as a ``datasets.Dataset``
    with a ``prompt`` column of messages and a ``letters`` column (the word)."""
    from datasets import load_dataset

    _check_split(split)
    return load_dataset("json", data_files=str(DATA_DIR / f"chat_{split}.jsonl"), split="train")


def answer_text(completion: str | list[dict[str, str]]) -> str:
    """A completion's answer: its (last message's) text after an optional leading ``<think>...</think>`` block."""
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    think = _THINK_BLOCK.match(text)
    return (text[think.end() :] if think else text).strip()


def letters_in_answer(completions: list, letters: list[str], **kwargs) -> list[float]:
    """Fraction of the first ``ANSWER_LENGTH`` characters of each answer that are letters of the word (TRL's
    conversational convention: each completion is ``[{"role": "assistant", "content": text}]``; strings work too)."""
    return [
        sum(ch in set(word) for ch in answer_text(completion)[:ANSWER_LENGTH]) / ANSWER_LENGTH
        for completion, word in zip(completions, letters)
    ]


def _random_reply(rng: random.Random) -> str:
    def random_letters() -> str:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, ANSWER_LENGTH)))

    think = f"<think>\n{random_letters()}\n</think>\n" if rng.random() < 0.5 else ""
    return think + random_letters()


def teach_reply_format(model, tokenizer, steps: int, batch_size: int, learning_rate: float, seed: int) -> None:
    """Fine-tune ``model`` on replies of random letters, optionally after a think block, each ended by
    ``<|im_end|>``; the loss covers the reply tokens only."""
    import torch

    rng = random.Random(seed + 1)  # not the dataset's stream
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    for _ in range(steps):
        rows = []
        for _ in range(batch_size):
            word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6)))
            prompt = tokenizer.apply_chat_template(_messages(rng, word), add_generation_prompt=True, return_dict=False)
            rows.append((prompt, tokenizer(_random_reply(rng) + "<|im_end|>")["input_ids"]))
        width = max(len(prompt) + len(reply) for prompt, reply in rows)
        input_ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100)
        for i, (prompt, reply) in enumerate(rows):
            input_ids[i, : len(prompt) + len(reply)] = torch.tensor(prompt + reply)
            attention_mask[i, : len(prompt) + len(reply)] = 1
            labels[i, len(prompt) : len(prompt) + len(reply)] = torch.tensor(reply)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def build_chat_model(tokenizer, teach=None, training: dict | None = None):
    """The tiny Qwen2 chat model: seeded initialisation, then ``teach(model, tokenizer, **training)`` (default
    ``teach_reply_format`` with ``FORMAT_TRAINING``); in eval mode."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    special = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = Qwen2Config(vocab_size=len(tokenizer), bos_token_id=None, **special, **MODEL_CONFIG)
    with torch.random.fork_rng():
        training = training or FORMAT_TRAINING
        torch.manual_seed(training["seed"])
        model = Qwen2ForCausalLM(config)
        (teach or teach_reply_format)(model, tokenizer, **training)
    model.generation_config = GenerationConfig(**special)
    return model.eval()


def chat_model_path() -> str:
    """Build the chat model and tokenizer once (about a minute on one core) and cache them; return the directory."""

    def build(directory: Path) -> None:
        tokenizer = build_chat_tokenizer()
        build_chat_model(tokenizer).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    spec = [CHAT_VERSION, SPECIAL_TOKENS, CHARACTERS, CHAT_TEMPLATE, MODEL_CONFIG, FORMAT_TRAINING, ANSWER_LENGTH]
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return build_cached(f"chat-model-{fingerprint}", build)


def untrained_chat_model_path() -> str:
    """The chat model's architecture and tokenizer with its seeded initialisation and no training, cached; a student
    for distillation from ``chat_model_path()`` (the same tokenizer)."""

    def build(directory: Path) -> None:
        tokenizer = build_chat_tokenizer()
        build_chat_model(tokenizer, teach=lambda model, tokenizer, **training: None).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    spec = [CHAT_VERSION, SPECIAL_TOKENS, CHARACTERS, CHAT_TEMPLATE, MODEL_CONFIG, FORMAT_TRAINING, "untrained"]
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return build_cached(f"chat-student-{fingerprint}", build)
