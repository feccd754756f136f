"""The tools a rollout may call, and one turn's tool calls run: TRL's conventions (a tool is a function with type
hints and a Google-style docstring; the model calls it by ``__name__``; a failure becomes ``{"error": ...}``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from ..rewards import event_loop
from ..rewards import is_async_reward as is_async


@dataclass
class ToolBox:
    """The tools one rollout row may call, by name: the standalone ``tools`` and its environment's methods."""

    tools: list[Callable] = field(default_factory=list)

    @property
    def by_name(self) -> dict[str, Callable]:
        return {tool.__name__: tool for tool in self.tools}


@dataclass
class ToolResults:
    """One turn's tool messages (``{"role": "tool", "name", "content"}``) and how many calls failed."""

    messages: list[dict]
    failures: int


def tool_message(name: str, result) -> dict:
    content = result if isinstance(result, list) else str(result)  # a list: multimodal content blocks, as TRL
    return {"role": "tool", "name": name, "content": content}


def error_message(name: str, err: Exception) -> dict:
    return tool_message(name, {"error": str(err)})


def run_tool_calls(tool_calls: list[dict], box: ToolBox) -> ToolResults:
    """Call each of one assistant turn's ``tool_calls`` (sync ones in order, async ones concurrently), and return one
    tool message per call, in the order the model made the calls. A call of an unknown tool, with bad arguments, one
    that raises, or whose result has no text (``str`` raises: an int past Python's digit limit) answers
    ``{"error": "..."}`` and counts as a failure."""
    tools = box.by_name
    results: list = [None] * len(tool_calls)
    names = [call.get("function", {}).get("name", call.get("name", "unknown")) for call in tool_calls]
    failures, pending = 0, []
    for i, call in enumerate(tool_calls):
        if call.get("type", "function") != "function":
            results[i], failures = {"error": f"Unsupported tool call type: {call.get('type')}"}, failures + 1
            continue
        tool, arguments = tools.get(names[i]), call["function"].get("arguments") or {}
        try:
            if tool is None:
                raise ValueError(f"Tool {names[i]} not found.")
            if not isinstance(arguments, dict):
                raise ValueError(f"Tool {names[i]} got arguments {arguments!r}, not a JSON object.")
            if is_async(tool):
                pending.append((i, tool(**arguments)))
            else:
                results[i] = tool(**arguments)
        except Exception as err:  # the model's mistake: it sees the error, as in TRL
            results[i], failures = {"error": str(err)}, failures + 1
    if pending:  # on the loop async reward functions use: one loop for the run, as TRL's

        async def run_all():
            return await asyncio.gather(*(coro for _, coro in pending), return_exceptions=True)

        for (i, _), result in zip(pending, asyncio.run_coroutine_threadsafe(run_all(), event_loop()).result()):
            if isinstance(result, Exception):
                result, failures = {"error": str(result)}, failures + 1
            results[i] = result
    messages = []
    for name, result in zip(names, results):
        try:
            messages.append(tool_message(name, result))
        except Exception as err:  # the result has no text; the same result comes back on every resume of the step
            messages.append(error_message(name, ValueError(f"its result cannot be made text: {err}")))
            failures += 1
    return ToolResults(messages, failures)


def rendered(results: ToolResults, render: Callable[[list[dict]], object]) -> tuple[ToolResults, object]:
    """``results`` and their rendering (their ids) as ``render`` gives it. A message the chat template cannot render
    (a result the template cannot show, e.g. a list into a text template) becomes an error answer and counts as a
    failed call, like a tool that raises: the same result would come back, and fail, on every resume of the step."""
    try:
        return results, render(results.messages)
    except Exception:
        pass
    messages, failures = list(results.messages), results.failures
    for i, message in enumerate(messages):
        try:
            render([message])
        except Exception as err:
            reason = ValueError(f"the chat template cannot render its result ({type(err).__name__}: {err})")
            messages[i], failures = error_message(message["name"], reason), failures + 1
    return ToolResults(messages, failures), render(messages)  # still raising: the template's fault, not a result's
