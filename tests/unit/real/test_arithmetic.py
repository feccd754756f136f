"""The arithmetic task (steadyrl/real/arithmetic.py): its splits, deterministic, disjoint and correct, and its
rewards, which read the reply's last number and its form."""

import pytest

from steadyrl.real import answer_format, arithmetic_dataset, correct_answer, final_number


def test_arithmetic_splits_are_deterministic_disjoint_and_correct():
    train, held_out = arithmetic_dataset("train"), arithmetic_dataset("eval")
    assert len(train) == 4096 and len(held_out) == 128
    assert arithmetic_dataset("train")["prompt"] == train["prompt"], "the same data for the same arguments"
    questions = {p[-1]["content"] for p in train["prompt"]}
    assert len(questions) == len(train) and not questions & {p[-1]["content"] for p in held_out["prompt"]}
    for prompt, answer in zip(held_out["prompt"], held_out["answer"]):
        a, b = map(int, prompt[-1]["content"].removeprefix("What is ").removesuffix("?").split(" + "))
        assert 10 <= a <= 99 and 10 <= b <= 99 and int(answer) == a + b
    three = arithmetic_dataset("eval", size=4, digits=3)
    assert all(len(p[-1]["content"].split()[2]) == 3 for p in three["prompt"])
    with pytest.raises(ValueError, match="split='test' is invalid"):
        arithmetic_dataset("test")
    with pytest.raises(ValueError, match="only 61 distinct 1-digit additions"):
        arithmetic_dataset("train", size=100, digits=1)


def test_rewards_read_the_replys_last_number_and_its_form():
    replies = ["47 + 38 = 85", "85", "To add 47 and 38, we need", "The answer is 85.", "85 or 86"]
    completions = [[{"role": "assistant", "content": text}] for text in replies]
    assert correct_answer(completions, answer=["85"] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert answer_format(completions) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert correct_answer(replies, answer=["85"] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0], "plain-text completions too"
    assert final_number("no number") is None
