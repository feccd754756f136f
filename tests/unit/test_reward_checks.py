"""The reward functions' checks made when a trainer is built (steadyrl/reward_checks.py): each callable, one weight
each, every parameter one that a call passes, and reward_timeout a positive number of seconds. The same refusals
from a built trainer: tests/integration/rewards/test_rewards_trl.py and tests/integration/errors/."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from datasets import Dataset

from steadyrl.reward_checks import as_list, check_reward_funcs, check_reward_timeout

DATASET = Dataset.from_dict({"prompt": ["abc:"], "letters": ["abc"], "answer": ["c"]})


def letters_score(completions, letters, **kwargs):
    return [0.0] * len(completions)


def needs_answer(completions, answer):
    return [0.0] * len(completions)


def needs_solution(prompts, completions, solution):
    return [0.0] * len(completions)


def test_weights_default_to_one_each_and_must_match_the_functions():
    funcs, weights = check_reward_funcs([letters_score, needs_answer], None, DATASET)
    assert funcs == [letters_score, needs_answer] and torch.equal(weights, torch.tensor([1.0, 1.0]))
    assert check_reward_funcs([letters_score], [0.5])[1].tolist() == [0.5]
    scaled = functools.partial(letters_score, scale=2)
    with pytest.raises(ValueError, match=r"reward_weights has 1 values but there are 2 rewards \['letters_score', "):
        check_reward_funcs([scaled, needs_answer], [1.0])


def test_a_missing_or_uncallable_reward_is_refused():
    with pytest.raises(ValueError, match="No reward source provided: pass reward_funcs"):
        check_reward_funcs(as_list(None), None)
    with pytest.raises(TypeError, match=r"reward_funcs\[1\]='letters' is not callable"):
        check_reward_funcs([letters_score, "letters"], None)
    assert as_list(letters_score) == [letters_score] and as_list((letters_score,)) == [letters_score]


def test_a_parameter_no_call_passes_is_refused_naming_the_columns():
    with pytest.raises(
        ValueError, match=r"reward_funcs\[0\] 'needs_solution' needs the parameter 'solution', which no call passes"
    ) as error:
        check_reward_funcs([needs_solution], None, DATASET)
    assert "the dataset's columns besides 'prompt' are ['answer', 'letters']" in str(error.value)
    with pytest.raises(ValueError, match=r"remove_unused_columns=True passes no dataset column"):
        check_reward_funcs([needs_answer], None, DATASET, remove_unused_columns=True)
    check_reward_funcs([letters_score], None, DATASET, remove_unused_columns=True)  # **kwargs absorbs the absence


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "30"])
def test_reward_timeout_is_a_positive_number_of_seconds_or_none(bad):
    check_reward_timeout(None)
    check_reward_timeout(2.5)
    with pytest.raises(ValueError, match=rf"reward_timeout={bad!r} is invalid: .* a finite number > 0, or None"):
        check_reward_timeout(bad)
