"""The tool-call loop on token ids. A trajectory is the prompt's ids, then turn after turn: the ids the policy
sampled, and the ids of the tool results and the next assistant opening (the environment's). Nothing is decoded and
re-encoded, so the trained ids are exactly the sampled ids plus the environment's, and ``env_mask`` tells them apart.

Shapes: N rows (one trajectory each); each row's ids grow turn by turn, at most ``max_completion_length`` after the
prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..generation import Generation
from .tools import ToolBox, rendered, run_tool_calls
from .turn_images import ToolReply, TurnImages

GenerateTurn = Callable[[list[list[int]], list[int], int], Generation]  # (prompt ids, row indices, turn) -> ids
ParseTurn = Callable[[int, list[int], list[int]], dict]  # (row, sampled ids, ids before them) -> assistant message


@dataclass
class Trajectories(Generation):
    """Multi-turn completions: ``completion_ids`` holds every turn's ids after the prompt, ``env_mask`` is 1 on the
    ids the policy sampled and 0 on the environment's, ``logprobs`` (when the engine reports them) 0.0 on the
    environment's. ``completions`` are the conversations the reward functions receive, ``reward_kwargs`` more keyword
    arguments for them (``environments``, a rollout_func's extra fields)."""

    env_mask: list[list[int]] | None = None
    completions: list | None = None
    reward_kwargs: dict[str, list] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class TurnCounts:
    tool_calls: int = 0
    tool_failures: int = 0
    turns: list[int] = field(default_factory=list)


def run_turns(
    generate: GenerateTurn,
    parse: ParseTurn,
    reply_of: Callable[[list[dict]], ToolReply],
    prompt_ids: list[list[int]],
    first: Generation,
    boxes: list[ToolBox],
    max_completion_length: int,
    max_iterations: int | None,
    context_length: int,
    images: TurnImages | None = None,
) -> Trajectories:
    """Run the tools each row's last turn called and sample the next turn, until no row calls a tool, the row's
    completion budget has no room for the results, or ``max_iterations`` tool rounds ran (TRL's
    ``max_tool_calling_iterations``; None: no limit). A round whose results would not fit ends the row as it is.
    ``reply_of(tool messages)``: their ids (and images); ``images``: the rows' image inputs, to which each kept
    reply's images are added before the turn that reads them is generated."""
    ids = [list(row) for row in first.completion_ids]
    logprobs = None if first.logprobs is None else [list(row) for row in first.logprobs]
    env_mask = [[1] * len(row) for row in ids]
    completions = [[parse(i, ids[i], prompt_ids[i])] for i in range(len(ids))]
    counts = TurnCounts(turns=[1] * len(ids))
    active = [i for i, turn in enumerate(completions) if turn[-1].get("tool_calls")]
    iteration = 0
    while active and (max_iterations is None or iteration < max_iterations):
        rows, contexts, suffixes = [], [], []
        for i in active:
            results, reply = rendered(run_tool_calls(completions[i][-1]["tool_calls"], boxes[i]), reply_of)
            counts.tool_calls += len(results.messages)
            counts.tool_failures += results.failures
            context = prompt_ids[i] + ids[i] + reply.ids
            if len(context) - len(prompt_ids[i]) > max_completion_length or len(context) >= context_length:
                continue  # no room for the results: the trajectory ends with the call
            completions[i].extend(results.messages)
            if images is not None:
                images.add(i, reply)
            rows.append(i), contexts.append(context), suffixes.append(reply.ids)
        if not rows:
            break
        iteration += 1
        turn = generate(contexts, rows, iteration)
        active = []
        for k, i in enumerate(rows):
            room = max_completion_length - (len(contexts[k]) - len(prompt_ids[i]))
            sampled = list(turn.completion_ids[k][:room])
            ids[i] += suffixes[k] + sampled
            env_mask[i] += [0] * len(suffixes[k]) + [1] * len(sampled)
            if logprobs is not None:
                logprobs[i] += [0.0] * len(suffixes[k]) + list(turn.logprobs[k][:room])
            counts.turns[i] += 1
            if sampled:
                completions[i].append(parse(i, sampled, contexts[k]))
                if completions[i][-1].get("tool_calls"):
                    active.append(i)
    metrics = turn_metrics(counts, env_mask)
    return Trajectories(ids, logprobs, env_mask=env_mask, completions=completions, metrics=metrics)


def turn_metrics(counts: TurnCounts, env_mask: list[list[int]]) -> dict[str, float]:
    """TRL's ``tools/call_frequency`` (calls per rollout row) and ``tools/failure_frequency`` (failed / made), the
    mean number of assistant turns per row, and the share of completion tokens the environment wrote."""
    rows, tokens = max(len(env_mask), 1), sum(len(m) for m in env_mask)
    return {
        "tools/call_frequency": counts.tool_calls / rows,
        "tools/failure_frequency": counts.tool_failures / counts.tool_calls if counts.tool_calls else 0.0,
        "turns_per_rollout": sum(counts.turns) / rows,
        "env_token_share": (tokens - sum(sum(m) for m in env_mask)) / tokens if tokens else 0.0,
    }
