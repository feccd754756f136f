"""Prompts (steadyrl/data/prompts.py): a bad row named before any work, conversations told from strings and rendered
with the chat template, the last user turn found in a rendered conversation, and long prompts cut on the left."""

from __future__ import annotations

import logging

import pytest
from datasets import Dataset

from steadyrl.data.prompts import PromptTruncation, UserTurns, check_prompts, prompt_kind, tokenize_prompts
from steadyrl.toy import build_chat_tokenizer, build_tokenizer

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Spell abc."}]


@pytest.mark.parametrize(
    "bad, problem",
    [
        ("  ", "is an empty string"),
        (None, "is None"),
        (7, "is a int, neither a string nor a list"),
        ([{"role": "user", "content": 3}], "has a message 0 whose 'content' is int, not a string"),
        ([{"content": "hi"}], "has a message 0 without a 'role'"),
    ],
)
def test_a_bad_prompt_is_named_by_its_row(bad, problem):
    dataset = Dataset.from_list([{"prompt": "abc:"}, {"prompt": "xyz:"}]).to_dict()
    dataset["prompt"][1] = bad
    with pytest.raises(ValueError, match=rf"train_dataset\['prompt'\]\[1\] {problem}"):
        prompt_kind(dataset, "train_dataset")


def test_conversations_need_a_chat_template_and_are_rendered_with_it():
    chat, plain = build_chat_tokenizer(), build_tokenizer()
    assert check_prompts(Dataset.from_dict({"prompt": ["abc:"]}), "train_dataset", plain) is False
    conversations = Dataset.from_dict({"prompt": [CONVERSATION]})
    assert check_prompts(conversations, "train_dataset", chat) is True
    with pytest.raises(ValueError, match="train_dataset holds conversations .* processing_class has no chat template"):
        check_prompts(conversations, "train_dataset", plain)
    ids = tokenize_prompts([CONVERSATION], chat, conversational=True, chat_template_kwargs=None)[0]
    rendered = chat.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    assert chat.decode(ids) == rendered and "Spell abc." in rendered


def test_the_last_user_turn_is_found_in_a_rendered_conversation():
    chat = build_chat_tokenizer()
    turns = UserTurns.of(chat)
    conversation = [*CONVERSATION, {"role": "assistant", "content": "abc"}, {"role": "user", "content": "Now xyz."}]
    assert turns.last(chat.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)) == "Now xyz."
    assert turns.last("no template here") is None


def test_long_prompts_keep_their_last_tokens_and_are_counted_and_warned_about_once(caplog):
    cut = PromptTruncation(max_length=3)
    with caplog.at_level(logging.WARNING):
        assert cut([[1, 2, 3, 4, 5], [6, 7]]) == ([[3, 4, 5], [6, 7]], 1)
        assert cut([[1, 2, 3, 4]]) == ([[2, 3, 4]], 1)
    assert caplog.text.count("longer than max_prompt_length=3") == 1
