"""Prompts as the model sees them: plain strings, or conversations rendered with the tokenizer's chat template.

A dataset's ``prompt`` column holds either strings or, as in TRL's conversational format, lists of messages
``{"role": ..., "content": ...}``. Conversations are rendered with ``add_generation_prompt=True``; reward functions
then receive the messages as ``prompts`` and each completion as ``[{"role": "assistant", "content": text}]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
from transformers.utils import logging

logger = logging.get_logger(__name__)


def is_conversation(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt)


def _prompt_problem(prompt) -> str | None:
    """Why ``prompt`` cannot be used, or None."""
    if prompt is None:
        return "is None"
    if isinstance(prompt, str):
        return "is an empty string" if not prompt.strip() else None
    if not is_conversation(prompt):
        return f"is a {type(prompt).__name__}, neither a string nor a list of {{'role', 'content'}} messages"
    if not prompt:
        return "is an empty list of messages"
    for i, message in enumerate(prompt):
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            return f"has a message {i} without a 'role'"
        if isinstance(content, list):  # content blocks, as TRL's vision-language datasets give them
            kinds = [block.get("type") if isinstance(block, dict) else None for block in content]
            if any(kind not in CONTENT_BLOCKS for kind in kinds):
                return f"has a message {i} with content blocks of types {kinds}: each must be one of {CONTENT_BLOCKS}"
        elif not isinstance(content, str):
            return f"has a message {i} whose 'content' is {type(content).__name__}, not a string or a list of blocks"
    return None


CONTENT_BLOCKS = ("text", "image")  # a message's content blocks steadyrl reads (TRL's multimodal messages)


def check_prompt(prompt, where: str) -> None:
    """Refuse a prompt that is neither a non-empty string nor a non-empty list of messages."""
    problem = _prompt_problem(prompt)
    if problem is not None:
        raise ValueError(
            f"{where} {problem}: every prompt must be a non-empty string or a list of {{'role', 'content'}} messages. "
            "Remove or fix that row."
        )


def prompt_kind(dataset, argument: str, stream_rows: int = 8) -> bool:
    """Check every row's prompt before any work (of a ``datasets.IterableDataset``: its first ``stream_rows``, read
    through a copy, the rest as they are drawn); return whether they are conversations."""
    if isinstance(dataset, datasets.IterableDataset):
        prompts = [row.get("prompt") for row in dataset.take(stream_rows)]
    else:
        prompts = dataset["prompt"]
    for row, prompt in enumerate(prompts):
        check_prompt(prompt, f"{argument}['prompt'][{row}]")
    return is_conversation(prompts[0])


def check_prompts(dataset, argument: str, tokenizer) -> bool:
    """``prompt_kind``, and a conversation needs a tokenizer with a chat template; whether they are conversations."""
    conversational = prompt_kind(dataset, argument)
    if conversational and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{argument} holds conversations (lists of messages), but processing_class has no chat template to "
            "render them: use the chat model's own tokenizer, set tokenizer.chat_template, or give plain-string "
            "prompts."
        )
    return conversational


def tokenize_prompts(
    prompts: Sequence, tokenizer, conversational: bool, chat_template_kwargs: dict | None
) -> list[list[int]]:
    """The token ids the model sees for each prompt (a conversation ends with the assistant's turn opening)."""
    if not conversational:
        return tokenizer(list(prompts))["input_ids"]
    rendered = tokenizer.apply_chat_template(
        list(prompts), add_generation_prompt=True, tokenize=True, return_dict=True, **(chat_template_kwargs or {})
    )
    return [list(ids) for ids in rendered["input_ids"]]


def prompt_texts(prompts: Sequence, tokenizer, conversational: bool, chat_template_kwargs: dict | None) -> list[str]:
    """Each prompt as text, a conversation rendered as the model sees it (what a pairwise judge reads)."""
    if not conversational:
        return list(prompts)
    return [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {}))
        for p in prompts
    ]


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return a[len(a) - n :]


class UserTurns:
    """Finds the last user turn in a conversation rendered with a chat template, from the text the template puts
    before a user message's content (``start``: shared by a first and a later user turn) and after the last one
    (``end``: its close and the assistant's opening), both learnt by rendering probe conversations."""

    def __init__(self, start: str, end: str) -> None:
        self.start, self.end = start, end

    @classmethod
    def of(cls, tokenizer, chat_template_kwargs: dict | None = None) -> UserTurns | None:
        """The markers of ``tokenizer``'s chat template; None where probing it fails or finds none."""
        a, b, c = "\x1fsteadyrl-a\x1f", "\x1fsteadyrl-b\x1f", "\x1fsteadyrl-c\x1f"

        def render(*contents: str) -> str:
            roles = ["user", "assistant"] * len(contents)
            messages = [{"role": role, "content": text} for role, text in zip(roles, contents)]
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
            )

        try:
            one, three = render(a), render(a, b, c)
        except Exception:  # a template that cannot render the probes: the caller falls back
            return None
        if one.count(a) != 1 or three.count(b) != 1 or three.count(c) != 1:
            return None
        before, end = one.split(a)
        start = _common_suffix(before, three[three.index(b) + len(b) : three.index(c)])
        return cls(start, end) if start and end else None

    def last(self, text: str) -> str | None:
        """The content of the last user turn in ``text``; None if ``text`` does not end with one. A prompt cut on
        the left before that turn's opening gives what is left of it."""
        if not text.endswith(self.end):
            return None
        body = text[: len(text) - len(self.end)]
        return body[body.rfind(self.start) + len(self.start) :] if self.start in body else body


def as_completions(texts: list[str], conversational: bool) -> list:
    """Completions as reward functions receive them: strings, or TRL's one-message assistant turns."""
    return [[{"role": "assistant", "content": text}] for text in texts] if conversational else texts


class PromptTruncation:
    """Cuts prompts to their last ``max_length`` tokens, says so once per run, and counts how many it cut."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self.warned = False

    def __call__(self, ids: list[list[int]]) -> tuple[list[list[int]], int]:
        cut = sum(len(p) > self.max_length for p in ids)
        if cut and not self.warned:
            longest = max(len(p) for p in ids)
            logger.warning(
                f"{cut} of {len(ids)} prompts of this rollout are longer than max_prompt_length={self.max_length} "
                f"tokens (the longest has {longest}); they are cut on the left, keeping their last "
                f"{self.max_length} tokens. The share of cut prompts is logged as prompts_truncated; raise "
                "max_prompt_length to keep them whole. (Said once per run.)"
            )
            self.warned = True
        return [p[-self.max_length :] for p in ids], cut
