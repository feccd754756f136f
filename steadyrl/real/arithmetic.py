"""A verifiable task for a real chat model: additions asked in words, with rewards written the TRL way.

``arithmetic_dataset`` generates the problems deterministically as a conversational dataset (a ``prompt`` column
of one user message, ``"What is 47 + 38?"``, and an ``answer`` column); its ``"eval"`` split never shares a
problem with ``"train"``. ``correct_answer`` and ``answer_format`` are reward functions with TRL's signature;
``greedy_accuracy`` is the held-out measure (greedy decoding, the share of replies whose last number is the sum).
"""

from __future__ import annotations

import random
import re

import torch

EVAL_SIZE = 128
TRAIN_SIZE = 4096
QUESTION = "What is {a} + {b}?"
_NUMBER = re.compile(r"-?\d+")
# the result alone ("85", "85.") or the sum written out once ("47 + 38 = 85")
_CONCISE = re.compile(r"\s*(?:\d+\s*\+\s*\d+\s*=\s*)?-?\d+\s*\.?\s*")


def _pairs(rng: random.Random, digits: int, count: int, exclude: set) -> list[tuple[int, int]]:
    low, high = 10 ** (digits - 1), 10**digits - 1
    available = (high - low + 1) ** 2 - len(exclude)
    if count > available:
        raise ValueError(f"size={count}: there are only {available} distinct {digits}-digit additions for this split")
    pairs: dict[tuple[int, int], None] = {}
    while len(pairs) < count:
        pair = (rng.randint(low, high), rng.randint(low, high))
        if pair not in exclude:
            pairs[pair] = None
    return list(pairs)


def arithmetic_dataset(split: str = "train", size: int | None = None, digits: int = 2, seed: int = 0):
    """``size`` distinct ``digits``-digit additions as a conversational ``datasets.Dataset`` (columns ``prompt``,
    ``answer``), the same for the same arguments. Default sizes: 4096 for ``"train"``, 128 for ``"eval"`` (fewer
    for 1-digit numbers).

    Example:
        >>> arithmetic_dataset("eval", size=2)[0]
        {'prompt': [{'role': 'user', 'content': 'What is 36 + 44?'}], 'answer': '80'}
    """
    from datasets import Dataset

    if split not in ("train", "eval"):
        raise ValueError(f"split={split!r} is invalid: use 'train' or 'eval'.")
    if digits < 1:
        raise ValueError(f"digits={digits} is invalid: use 1 or more.")
    held_out_size = min(EVAL_SIZE, (9 * 10 ** (digits - 1)) ** 2 // 4)  # a quarter of the 1-digit problems
    held_out = _pairs(random.Random(f"eval/{digits}/{seed}"), digits, held_out_size, set())
    if split == "eval":
        if (size or held_out_size) > held_out_size:
            raise ValueError(f"size={size}: the eval split of {digits}-digit additions holds {held_out_size} problems")
        pairs = held_out[: size or held_out_size]
    else:
        pairs = _pairs(random.Random(f"train/{digits}/{seed}"), digits, size or TRAIN_SIZE, set(held_out))
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": QUESTION.format(a=a, b=b)}] for a, b in pairs],
            "answer": [str(a + b) for a, b in pairs],
        }
    )


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def final_number(text: str) -> str | None:
    """The last integer in ``text`` (the reply's answer), or None."""
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def correct_answer(completions, answer, **kwargs) -> list[float]:
    """1.0 where the reply's last number is the sum (the ``answer`` column), else 0.0."""
    return [float(final_number(_text(c)) == a) for c, a in zip(completions, answer)]


def answer_format(completions, **kwargs) -> list[float]:
    """1.0 where the reply is only the result (``"85"``) or the sum written out (``"47 + 38 = 85"``), else 0.0."""
    return [float(_CONCISE.fullmatch(_text(c)) is not None) for c in completions]


@torch.no_grad()
def greedy_accuracy(model, tokenizer, dataset, max_new_tokens: int = 16, batch_size: int = 32) -> tuple[float, list]:
    """Held-out accuracy: the share of ``dataset``'s problems whose greedy reply (at most ``max_new_tokens``) has
    the sum as its last number; and the replies."""
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    replies = []
    try:
        for i in range(0, len(dataset), batch_size):
            rows = dataset[i : i + batch_size]
            texts = [
                tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
                for prompt in rows["prompt"]
            ]
            inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            output = model.generate(
                **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            replies += tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        model.train(was_training)
        tokenizer.padding_side = side
    return sum(correct_answer(replies, dataset["answer"])) / len(dataset), replies
