"""Tool calls through the chat template, on token ids: the prompt rendered with its tools, tool calls parsed from the
sampled ids, tool results rendered as the ids that follow the model's turn, and the build-time check that makes
concatenating ids equal to rendering the whole conversation (the template only appends)."""

from __future__ import annotations

from collections.abc import Callable

from jinja2 import TemplateError
from transformers.utils import logging

logger = logging.get_logger(__name__)

_SENTINELS = ("tool_name_7f3a", "arg_key_91c2", "arg_value_5be0", "tool_content_d4e8")


def _call(name: str, arguments: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": name, "arguments": arguments}}]


def assistant_call_head(name: str) -> list[dict]:
    """A user turn, then an assistant turn that only calls ``name``: what a tool reply is rendered after."""
    return [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": _call(name, {})}]


def render(tokenizer, messages: list[dict], chat_template_kwargs: dict, tools=None, generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt, **chat_template_kwargs
    )


def check_tool_template(tokenizer, chat_template_kwargs: dict) -> None:
    """Refuse a chat template that cannot show the model a tool call and its result (it drops either)."""
    name, key, value, content = _SENTINELS
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": _call(name, {key: value})},
        {"role": "tool", "name": name, "content": content},
    ]
    try:
        text = render(tokenizer, messages, chat_template_kwargs)
    except (TemplateError, TypeError) as err:
        text = f"<the template raised {type(err).__name__}: {err}>"
    lost = [s for s in _SENTINELS if s not in text]
    if lost:
        raise ValueError(
            "tools / environment_factory need a chat template that renders an assistant's tool_calls and the tool's "
            f"reply; this tokenizer's template loses {lost} of user -> assistant(tool_calls) -> tool. Give the "
            "tokenizer a tool-calling template (tokenizer.chat_template = ...), e.g. the model family's own or one of "
            "TRL's (trl/chat_templates/)."
        )


def enable_tool_parsing(tokenizer) -> None:
    """Tool calls are parsed with transformers' ``tokenizer.parse_response``, which needs a ``response_template``;
    without one, TRL's (when installed) is set for the chat templates TRL knows (Qwen, Llama 3, ...)."""
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return
    try:
        from trl.chat_template_utils import add_response_schema

        add_response_schema(tokenizer)
    except (ImportError, ValueError) as err:
        raise ValueError(
            "tools / environment_factory need to parse tool calls from the model's output, and this tokenizer has no "
            "response_template (transformers' response parsing) for its chat template "
            f"({type(err).__name__}: {err}). Set tokenizer.response_template for the template, or use a chat template "
            "TRL knows (trl.chat_template_utils.add_response_schema)."
        ) from err


def parse_turn(tokenizer, ids: list[int], prefix: list[int], tools: list[Callable]) -> dict:
    """The assistant message in one turn's sampled ids (``tool_calls`` when it made any); text that does not parse
    is plain content, as TRL's ``parse_response``."""
    try:
        parsed = tokenizer.parse_response(ids, prefix=prefix, tools=tools or None)
        if parsed is None:
            raise ValueError("nothing parsed")
        content = parsed.get("content")
        parsed["content"] = content.removesuffix(tokenizer.eos_token) if isinstance(content, str) else content or ""
        for call in parsed.get("tool_calls") or []:
            function = call["function"]
            if not isinstance(function.get("name"), str) or "arguments" not in function:
                raise ValueError(f"malformed tool call {call!r}")
        return parsed
    except (ValueError, TypeError, KeyError, AttributeError):
        return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}


def training_template_kwargs(tokenizer, tools: list[Callable], chat_template_kwargs: dict) -> dict:
    """The chat-template arguments multi-turn rendering uses: as given where the template is append-only, else with
    TRL's training version of the template (``trl.chat_template_utils.get_training_chat_template``: Qwen3's drops an
    empty reasoning block once a tool reply follows), as TRL's GRPOTrainer swaps it in. The tokenizer keeps its own
    template (the one saved with the model). A template neither append-only nor known to TRL is refused."""
    try:
        check_append_only(tokenizer, tools, chat_template_kwargs)
        return chat_template_kwargs
    except ValueError:
        training = _trl_training_template(tokenizer)
        if training is None:
            raise
    swapped = {**chat_template_kwargs, "chat_template": training}
    check_append_only(tokenizer, tools, swapped)
    logger.warning(
        "The tokenizer's chat template re-renders earlier turns of a tool conversation; multi-turn rollouts are "
        "rendered with TRL's training version of it (trl.chat_template_utils.get_training_chat_template), as TRL "
        "does. The tokenizer saved with the model keeps its own template."
    )
    return swapped


def _trl_training_template(tokenizer) -> str | None:
    try:
        from trl.chat_template_utils import get_training_chat_template

        return get_training_chat_template(tokenizer)
    except (ImportError, ValueError):
        return None


def tool_suffix_ids(tokenizer, tool_messages: list[dict], chat_template_kwargs: dict) -> list[int]:
    """The ids that follow an assistant turn ending in EOS: the tool messages, then the next assistant turn's
    opening. Rendered after a stand-in turn with the same tool name and cut after its EOS, as TRL does; the append-only
    check at build time makes this equal to rendering the real conversation."""
    head = assistant_call_head(tool_messages[0]["name"])
    before = tokenizer.apply_chat_template(head, tokenize=True, return_dict=False, **chat_template_kwargs)
    after = tokenizer.apply_chat_template(
        head + tool_messages, tokenize=True, return_dict=False, add_generation_prompt=True, **chat_template_kwargs
    )
    before = cut_after_eos(before, tokenizer.eos_token_id)
    if after[: len(before)] != before:
        raise ValueError("the chat template renders an assistant turn differently once a tool reply follows it")
    return list(after[len(before) :])


def cut_after_eos(ids: list[int], eos_token_id: int) -> list[int]:
    """``ids`` up to their last EOS (kept), or all of them without one."""
    eos = [i for i, token in enumerate(ids) if token == eos_token_id]
    return list(ids[: eos[-1] + 1]) if eos else list(ids)


def _first_difference(before: str, after: str) -> str:
    start = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    return f"{before[max(0, start - 20) : start + 40]!r} became {after[max(0, start - 20) : start + 40]!r}"


def check_append_only(tokenizer, tools: list[Callable], chat_template_kwargs: dict) -> None:
    """Refuse a chat template that re-renders earlier turns of a tool conversation once more turns follow (Qwen3's,
    which drops earlier reasoning, is one): the trained ids are the concatenation of each turn's ids, so they must
    equal the whole conversation rendered at once. Names the first turn whose rendering changed and the text."""
    name = tools[0].__name__ if tools else "lookup"
    head = assistant_call_head(name)
    before = render(tokenizer, head, chat_template_kwargs, tools)
    after = render(tokenizer, head + [{"role": "tool", "name": name, "content": "5"}], chat_template_kwargs, tools)
    if not after.startswith(before.rstrip()):
        raise ValueError(
            "The chat template is not append-only: a tool reply after an assistant turn without text re-renders "
            f"that turn: {_first_difference(before, after)}. Multi-turn training concatenates each turn's token ids, "
            "so they would differ from the conversation the template renders. Use a template that keeps earlier "
            "turns as they were (e.g. TRL's trl.chat_template_utils.get_training_chat_template(tokenizer))."
        )
    user = [{"role": "user", "content": "x"}]
    assistant_opening = render(tokenizer, user, chat_template_kwargs, tools, generation_prompt=True)
    # a template whose assistant opening closes an empty reasoning block (Qwen3.5's NoThink) has turns without one
    think = (
        ("", "")
        if assistant_opening.rstrip().endswith("</think>")
        else ("<think>\nadd\n</think>\n\n", "<think>\ndone\n</think>\n\n")
    )
    turns = [
        [{"role": "user", "content": "What is 2 + 3?"}],
        [{"role": "assistant", "content": think[0], "tool_calls": _call(name, {"a": 2})}],
        [{"role": "tool", "name": name, "content": "5"}],
        [{"role": "assistant", "content": think[1] + "It is 5."}],
    ]
    messages, previous = [], None
    for index, turn in enumerate(turns):
        messages = messages + turn
        # after a user or tool turn the assistant's opening follows: it is part of what the model saw
        opening = turn[0]["role"] != "assistant"
        text = render(tokenizer, messages, chat_template_kwargs, tools, generation_prompt=opening)
        if previous is not None and not text.startswith(previous):
            raise ValueError(
                f"The chat template is not append-only: adding turn {index} ({turn[0]['role']}) re-renders the turns "
                f"before it differently: {_first_difference(previous, text)}. Multi-turn training concatenates each "
                "turn's token ids, so they would differ from the conversation the template renders. Use a template "
                "that keeps earlier turns as they were (e.g. TRL's "
                "trl.chat_template_utils.get_training_chat_template(tokenizer))."
            )
        previous = text


def tokenize_with_tools(prompts: list, tokenizer, tools_per_row: list[list[Callable]], kwargs: dict) -> list[list[int]]:
    """Each conversation's ids with its tools described by the chat template, ending with the assistant's opening."""
    return [
        list(
            tokenizer.apply_chat_template(
                p, tools=t or None, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
            )
        )
        for p, t in zip(prompts, tools_per_row)
    ]
