"""Pairwise judges (steadyrl/judges.py): a plain callable or an object with TRL's ``judge`` method, its answers
checked so that a failing judge (TRL's return -1) stops the run instead of training on a made-up preference."""

from __future__ import annotations

import pytest

from steadyrl.judges import JudgeError, call_judge, check_judge

PROMPTS = ["abc:", "xyz:"]
PAIRS = [["aab", "zzz"], ["xyx", "q"]]


def longer(prompts, pairs):
    return [int(len(b) > len(a)) for a, b in pairs]


class TRLStyleJudge:
    """As TRL's BasePairwiseJudge subclasses: the answers come from a ``judge`` method."""

    def judge(self, prompts, completions, shuffle_order=True):
        return [1, 0]


def test_a_function_or_an_object_with_a_judge_method_answers():
    assert call_judge(longer, PROMPTS, PAIRS) == [0, 0]
    assert call_judge(TRLStyleJudge(), PROMPTS, PAIRS) == [1, 0]
    assert call_judge(lambda prompts, pairs: (1.0, 0), PROMPTS, PAIRS) == [1, 0], "1.0 counts as 1"
    with pytest.raises(TypeError, match=r"judge=3 is neither callable nor has a judge\(\) method"):
        check_judge(3)


@pytest.mark.parametrize(
    "answers, message",
    [
        ([-1, 0], r"judge 'bad' returned -1 for pair 0 \(1 bad answers in all\): each answer must be 0"),
        ([True, 0], r"judge 'bad' returned True for pair 0"),
        ([0, 2], r"judge 'bad' returned 2 for pair 1"),
        ([0], r"judge 'bad' returned 1 answers for 2 completion pairs"),
    ],
)
def test_anything_but_one_0_or_1_per_pair_is_refused(answers, message):
    def bad(prompts, pairs):
        return answers

    with pytest.raises(JudgeError, match=message):
        call_judge(bad, PROMPTS, PAIRS)


def test_a_judge_that_raises_is_named_with_its_error():
    def flaky(prompts, pairs):
        raise ConnectionError("judge service down")

    with pytest.raises(JudgeError, match="judge 'flaky' raised ConnectionError: judge service down") as error:
        call_judge(flaky, PROMPTS, PAIRS)
    assert isinstance(error.value.__cause__, ConnectionError)
