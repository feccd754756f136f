"""The embedded tool-calling fixture: the chat fixture's tiny model and tokenizer, taught a calculator's call format.

The task: the user asks for the sum of two numbers; the model may call ``add(a, b)`` as
``<tool_call>\\n{"name": "add", "arguments": {"a": 3, "b": 4}}\\n</tool_call><|im_end|>``, reads the tool's reply and
answers. The model is taught the format for ``FORMAT_TRAINING['steps']`` steps on conversations whose arguments and
answers are random digits, so its calls parse (and run) while their numbers are mostly wrong: RL has the task to
learn. The chat template is a compact ChatML with tools (one system line naming them), so a prompt stays within the
model's 512 positions at one token per character.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from ..cache import build_cached
from .chat import MODEL_CONFIG, build_chat_model, build_chat_tokenizer

TOOLS_VERSION = 1
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\ntools: ' }}"
    "{% for tool in tools %}{{ (tool.function or tool).name }}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + message.content }}"
    "{% for call in message.tool_calls or [] %}"
    "{{ '<tool_call>\\n' + (call.function | tojson) + '\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
RESPONSE_TEMPLATE = {  # transformers' response parsing (tokenizer.parse_response) for TOOL_CHAT_TEMPLATE
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
FORMAT_TRAINING = dict(steps=500, batch_size=16, learning_rate=2e-3, seed=0)
QUESTIONS = ["What is {a} + {b}?", "Add {a} and {b}.", "Compute {a} plus {b}."]
HINTS = ["", " Use the tool."]  # taught after a question: what an environment's reset() may append


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class Calculator:
    """A calculator environment (``environment_factory=Calculator``): ``add`` is its tool; ``get_reward`` pays 1
    when one of the model's calls added the question's numbers (the row's ``answer``)."""

    def reset(self, prompt, answer, **row) -> str:
        self.answer, self.results = int(answer), []
        return HINTS[1]

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.results.append(a + b)
        return a + b

    def get_reward(self) -> float:
        return float(self.answer in self.results)


def tool_tokenizer():
    """The chat fixture's tokenizer with ``TOOL_CHAT_TEMPLATE`` and its ``response_template``."""
    tokenizer = build_chat_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def sum_rows(count: int, seed: int) -> list[dict]:
    """``count`` conversational prompts asking for a sum, with the ``answer`` column (as text)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        rows.append(
            {"prompt": [{"role": "user", "content": rng.choice(QUESTIONS).format(a=a, b=b)}], "answer": str(a + b)}
        )
    return rows


def sum_dataset(count: int = 32, seed: int = 0):
    from datasets import Dataset

    return Dataset.from_list(sum_rows(count, seed))


def correct_sum(completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 where the last assistant message's text is the sum."""
    return [
        float(c[-1]["content"].strip() == a) if c[-1]["role"] == "assistant" else 0.0
        for c, a in zip(completions, answer)
    ]


def _conversation(rng: random.Random, right_share: float = 0.0) -> list[dict]:
    a, b = rng.randint(0, 49), rng.randint(0, 49)
    x, y = rng.randint(0, 49), rng.randint(0, 49)  # the call's arguments: random, like the answer
    content = rng.choice(QUESTIONS).format(a=a, b=b) + rng.choice(HINTS)
    answer = rng.randint(0, 98)
    if right_share and rng.random() < right_share:  # a conversation that calls with the question's numbers
        x, y, answer = a, b, a + b
    call = [{"type": "function", "function": {"name": "add", "arguments": {"a": x, "b": y}}}]
    return [
        {"role": "user", "content": content},
        {"role": "assistant", "content": "", "tool_calls": call},
        {"role": "tool", "name": "add", "content": str(x + y)},
        {"role": "assistant", "content": str(answer)},
    ]


def teach_tool_format(
    model, tokenizer, steps: int, batch_size: int, learning_rate: float, seed: int, right_share: float = 0.0
) -> None:
    """Fine-tune ``model`` on tool conversations, ``right_share`` of them calling with the question's numbers and
    answering the sum (the others: random arguments and answer); the loss covers the assistant turns only."""
    import torch
    from transformers.utils import get_json_schema

    rng = random.Random(seed + 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    tools = [get_json_schema(add)]  # what the template would make of [add] on every call, made once

    def ids(conversations, opening):
        return tokenizer.apply_chat_template(
            conversations, tools=tools, add_generation_prompt=opening, return_dict=False
        )

    for _ in range(steps):
        conversations = [_conversation(rng, right_share) for _ in range(batch_size)]  # 4 messages each
        # each conversation up to the end of its assistant turns (messages 2 and 4: the second is the whole), and
        # up to their opening (messages 1 and 3, then the generation prompt): the same token ids as rendering the
        # prefixes one at a time, in 2 calls instead of 5 x batch_size
        closed = ids([c[:n] for c in conversations for n in (4, 2)], False)
        opened = ids([c[:n] for c in conversations for n in (1, 3)], True)
        rows = []
        for i in range(batch_size):
            full = closed[2 * i]
            labels = [-100] * len(full)
            # the assistant turns: from after their opening to their <|im_end|> (a closed turn ends with a newline)
            for opening, turn_end in ((opened[2 * i], closed[2 * i + 1]), (opened[2 * i + 1], full)):
                start, end = len(opening), len(turn_end) - 1
                labels[start:end] = full[start:end]
            rows.append((full, labels))
        width = max(len(full) for full, _ in rows)
        input_ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        targets = torch.full((batch_size, width), -100)
        for i, (full, labels) in enumerate(rows):
            input_ids[i, : len(full)], mask[i, : len(full)] = torch.tensor(full), 1
            targets[i, : len(full)] = torch.tensor(labels)
        model(input_ids=input_ids, attention_mask=mask, labels=targets).loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def tool_model_path() -> str:
    """Build the tool-calling model and tokenizer once and cache them; return the directory."""

    def build(directory: Path) -> None:
        tokenizer = tool_tokenizer()
        build_chat_model(tokenizer, teach_tool_format, FORMAT_TRAINING).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    spec = [TOOLS_VERSION, TOOL_CHAT_TEMPLATE, RESPONSE_TEMPLATE, MODEL_CONFIG, FORMAT_TRAINING, QUESTIONS, HINTS]
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return build_cached(f"tool-model-{fingerprint}", build)
