"""Checks of the reward functions made when the trainer is built, so that a bad one fails before any rollout: each
callable, one weight each, and every parameter one that a call passes (TRL finds a missing column only when the
first rollout is scored); and the error a reward function's failure raises when it is called."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence

import torch

RewardFunc = Callable[..., Sequence[float | None]]

# Keyword arguments every reward function receives besides the dataset's columns and ``RewardInputs.extra``.
# ``environments`` comes through ``extra`` where a rollout has environments; it is listed so that a function asking
# for it passes the build-time check.
ALWAYS_PASSED = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")


class RewardFunctionError(ValueError):
    """A reward function raised, timed out, returned the wrong number of values or a non-finite value, or no reward
    function applied to a sample (every one returned ``None``)."""


def reward_func_name(func: RewardFunc) -> str:
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def as_list(reward_funcs) -> list:
    """``None``, one reward function, or a sequence of them, as a new list."""
    if reward_funcs is None:
        return []
    return list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]


def check_reward_timeout(reward_timeout: float | None) -> None:
    if reward_timeout is not None and not (
        isinstance(reward_timeout, (int, float)) and math.isfinite(reward_timeout) and reward_timeout > 0
    ):
        raise ValueError(
            f"reward_timeout={reward_timeout!r} is invalid: give the seconds a reward function may take per rollout, "
            "a finite number > 0, or None for no limit."
        )


def check_reward_funcs(
    funcs: list, reward_weights: Sequence[float] | None, dataset=None, remove_unused_columns: bool = False
) -> tuple[list[RewardFunc], torch.Tensor]:
    """Check the reward functions (a ``reward_model`` comes last) and return them with one weight each. With the
    training ``dataset``, also check that every parameter of each function will be passed."""
    if not funcs:
        raise ValueError(
            "No reward source provided: pass reward_funcs (callables returning one float per completion), "
            "reward_model, or an environment_factory whose environment defines get_reward()."
        )
    for i, func in enumerate(funcs):
        if not callable(func) and not hasattr(func, "score_inputs"):
            raise TypeError(
                f"reward_funcs[{i}]={func!r} is not callable; reward functions are called as "
                "func(prompts=..., completions=..., completion_ids=..., **dataset_columns)."
            )
    columns = dataset_columns(dataset)
    if columns is not None:
        check_reward_parameters(funcs, columns, remove_unused_columns)
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


def dataset_columns(dataset) -> list[str] | None:
    """The dataset's column names, or None where they are not known before reading it (some streaming datasets)."""
    names = getattr(dataset, "column_names", None)
    return list(names) if names is not None else None


def check_reward_parameters(funcs: list, columns: Sequence[str], remove_unused_columns: bool) -> None:
    """Refuse a reward function with a required parameter that no call would pass: not one of ``ALWAYS_PASSED``,
    not a column the trainer passes, and no ``**kwargs`` to absorb its absence. TRL finds this only when the first
    rollout is scored."""
    passed = set(ALWAYS_PASSED) | ({c for c in columns if c != "prompt"} if not remove_unused_columns else set())
    for i, func in enumerate(funcs):
        if hasattr(func, "score_inputs"):  # a reward model reads RewardInputs itself
            continue
        try:
            parameters = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):  # some builtins have no signature: nothing to check
            continue
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            continue
        required = [
            p.name
            for p in parameters
            if p.default is inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_POSITIONAL
        ]
        missing = [name for name in required if name not in passed]
        if missing:
            shown = sorted(c for c in columns if c != "prompt")
            given = (
                f"remove_unused_columns=True passes no dataset column (the dataset has {shown}): set it False to "
                "pass them"
                if remove_unused_columns
                else f"the dataset's columns besides 'prompt' are {shown}"
            )
            raise ValueError(
                f"reward_funcs[{i}] {reward_func_name(func)!r} needs the parameter {missing[0]!r}, which no call "
                f"passes: reward functions receive {list(ALWAYS_PASSED)} and the dataset's columns by name, and "
                f"{given}. Rename the parameter to a column, give it a default, or add **kwargs."
            )
