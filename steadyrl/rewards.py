"""Reward functions with TRL's calling convention, checked so a bad one fails loudly and early."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

RewardFunc = Callable[..., Sequence[float]]


@dataclass
class RewardInputs:
    """What reward functions, reward models and judges read of one rollout's N completions."""

    prompts: list  # as in the dataset: strings, or lists of {"role", "content"} messages
    completions: list  # strings, or [{"role": "assistant", "content": text}] for conversations (TRL's convention)
    completion_ids: list[list[int]]  # the sampled token ids, EOS included where one was sampled
    columns: dict[str, list]  # the dataset's other columns, one value per completion
    prompt_ids: list[list[int]]  # the prompt token ids the policy saw (chat template applied, truncated)
    prompt_texts: list[str]  # the prompts as text, chat template applied
    completion_texts: list[str]


class RewardFunctionError(ValueError):
    """A reward function raised, returned the wrong number of values, or returned a non-finite value."""


def reward_func_name(func: RewardFunc) -> str:
    return getattr(func, "__name__", type(func).__name__)


def as_list(reward_funcs) -> list:
    """``None``, one reward function, or a sequence of them, as a new list."""
    if reward_funcs is None:
        return []
    return list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]


def check_reward_funcs(funcs: list, reward_weights: Sequence[float] | None) -> tuple[list[RewardFunc], torch.Tensor]:
    """Check the reward functions (a ``reward_model`` comes last) and return them with one weight each."""
    if not funcs:
        raise ValueError(
            "No reward: pass reward_funcs (callables returning one float per completion) and/or reward_model."
        )
    for i, func in enumerate(funcs):
        if not callable(func) and not hasattr(func, "score_inputs"):
            raise TypeError(
                f"reward_funcs[{i}]={func!r} is not callable; reward functions are called as "
                "func(prompts=..., completions=..., completion_ids=..., **dataset_columns)."
            )
    if reward_weights is None:
        weights = [1.0] * len(funcs)
    else:
        weights = [float(w) for w in reward_weights]
        if len(weights) != len(funcs):
            names = [reward_func_name(f) for f in funcs]
            raise ValueError(
                f"reward_weights has {len(weights)} values but there are {len(funcs)} rewards {names} "
                "(reward_funcs, then reward_model if given): give one weight each."
            )
    return funcs, torch.tensor(weights, dtype=torch.float32)


def score_completions(funcs: list[RewardFunc], inputs: RewardInputs) -> torch.Tensor:
    """Call every reward function; return scores of shape [num_completions, num_funcs]. A reward model (an object
    with ``score_inputs``) reads the token ids or texts itself; any other callable gets TRL's keyword arguments."""
    n = len(inputs.completions)
    scores = torch.empty(n, len(funcs), dtype=torch.float32)
    for j, func in enumerate(funcs):
        name = reward_func_name(func)
        try:
            if hasattr(func, "score_inputs"):
                values = func.score_inputs(inputs)
            else:
                values = func(prompts=inputs.prompts, completions=inputs.completions,
                              completion_ids=inputs.completion_ids, **inputs.columns)  # fmt: skip
        except Exception as err:
            raise RewardFunctionError(f"reward function {name!r} raised {type(err).__name__}: {err}") from err
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError) as err:
            raise RewardFunctionError(
                f"reward function {name!r} must return a list of {n} floats, got {type(values).__name__}: {err}"
            ) from err
        if len(values) != n:
            raise RewardFunctionError(f"reward function {name!r} returned {len(values)} values for {n} completions.")
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            raise RewardFunctionError(
                f"reward function {name!r} returned a non-finite value ({values[bad[0]]}) for completion {bad[0]} "
                f"({inputs.completion_texts[bad[0]]!r}); {len(bad)} of {n} values are not finite."
            )
        scores[:, j] = torch.tensor(values, dtype=torch.float32)
    return scores
