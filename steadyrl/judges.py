"""Pairwise judges: ``judge(prompts, completion_pairs) -> list[int]``, the index (0 or 1) of the preferred completion.

A judge is a plain callable or an object with a ``judge`` method of that signature, such as TRL's
``BasePairwiseJudge`` subclasses. Its answers are checked: anything but one 0 or 1 per pair is an error,
so a judge that fails (TRL's judges return -1) stops the run instead of training on a made-up preference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

PairwiseJudge = Callable[[list[str], list[list[str]]], Sequence[int]]


class JudgeError(ValueError):
    """A pairwise judge raised or returned something other than one index in {0, 1} per pair."""


def judge_name(judge) -> str:
    return getattr(judge, "__name__", type(judge).__name__)


def check_judge(judge) -> None:
    if not callable(judge) and not callable(getattr(judge, "judge", None)):
        raise TypeError(
            f"judge={judge!r} is neither callable nor has a judge() method; a pairwise judge is called as "
            "judge(prompts, completion_pairs) and returns the index (0 or 1) of the preferred completion per pair."
        )


def call_judge(judge, prompts: list[str], pairs: list[list[str]]) -> list[int]:
    """The judge's preferred index per pair, checked."""
    name = judge_name(judge)
    function = judge.judge if callable(getattr(judge, "judge", None)) else judge
    try:
        answers = list(function(prompts, pairs))
    except Exception as err:
        raise JudgeError(f"judge {name!r} raised {type(err).__name__}: {err}") from err
    if len(answers) != len(pairs):
        raise JudgeError(f"judge {name!r} returned {len(answers)} answers for {len(pairs)} completion pairs.")
    bad = [(i, a) for i, a in enumerate(answers) if isinstance(a, bool) or a not in (0, 1)]
    if bad:
        i, answer = bad[0]
        raise JudgeError(
            f"judge {name!r} returned {answer!r} for pair {i} ({len(bad)} bad answers in all): each answer must be "
            "0 (the first completion is preferred) or 1 (the second is)."
        )
    return [int(a) for a in answers]
