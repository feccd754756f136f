"""Scoring completions with the reward functions (steadyrl/rewards.py), no trainer: a sample every function
returns None for is named, NaN is refused but None is not, async functions run concurrently (within the timeout, a
failure naming the function) and keep the functions' order, and log_metric / extra keyword arguments reach the
function. The same functions compared with TRL's GRPOTrainer and inside built trainers:
tests/integration/rewards/test_rewards_trl.py."""

from __future__ import annotations

import asyncio
import math

import pytest

from steadyrl import RewardFunctionError
from steadyrl.rewards import RewardInputs, score_completions

PROMPTS = ["abc:", "abc:", "xyz:", "xyz:", "mop:", "mop:"]
COMPLETIONS = ["aab", "zzz", "xyx", "q", "moo", "pp"]
TASKS = ["letters", "letters", "length", "length", "both", "both"]


def reward_inputs() -> RewardInputs:
    return RewardInputs(
        prompts=PROMPTS,
        completions=COMPLETIONS,
        completion_ids=[[1]] * len(PROMPTS),
        columns={"task": TASKS},
        prompt_ids=[[1]] * len(PROMPTS),
        prompt_texts=PROMPTS,
        completion_texts=COMPLETIONS,
    )


def test_every_function_returning_none_names_the_sample():
    def never(completions, **kwargs):
        return [None] * len(completions)

    def only_first(completions, **kwargs):
        return [1.0] + [None] * (len(completions) - 1)

    message = (
        r"every reward function \['never', 'only_first'\] returned None for sample 1 \(prompt 'abc:', "
        r"completion 'zzz'\); 5 of 6"
    )
    with pytest.raises(RewardFunctionError, match=message):
        score_completions([never, only_first], reward_inputs())


def test_a_nan_returned_is_refused_but_none_is_not():
    def nan_for_first(completions, **kwargs):
        return [math.nan] + [1.0] * (len(completions) - 1)

    with pytest.raises(RewardFunctionError, match="'nan_for_first' returned a non-finite value"):
        score_completions([nan_for_first], reward_inputs())


def test_async_functions_run_concurrently_in_function_order():
    events = []

    def slow_then_fast(name: str, value: float, delay: float):
        async def reward(completions, **kwargs):
            events.append(f"start {name}")
            await asyncio.sleep(delay)
            events.append(f"end {name}")
            return [value] * len(completions)

        reward.__name__ = name
        return reward

    scores = score_completions([slow_then_fast("slow", 1.0, 0.2), slow_then_fast("fast", 2.0, 0.05)], reward_inputs())
    assert events[:2] == ["start slow", "start fast"], f"both must start before either ends: {events}"
    assert events[2:] == ["end fast", "end slow"]
    assert scores[0].tolist() == [1.0, 2.0], "the scores keep the functions' order, not the order they finished in"


def test_an_async_timeout_names_the_function():
    async def hangs(completions, **kwargs):
        await asyncio.sleep(30)

    async def quick(completions, **kwargs):
        return [1.0] * len(completions)

    with pytest.raises(
        RewardFunctionError,
        match=r"async reward function 'hangs' did not return within "
        r"reward_timeout=0.2 seconds",
    ):
        score_completions([quick, hangs], reward_inputs(), timeout=0.2)


def test_an_async_failure_names_the_function():
    async def broken(completions, **kwargs):
        raise KeyError("answer")

    with pytest.raises(RewardFunctionError, match=r"reward function 'broken' raised KeyError: 'answer'"):
        score_completions([letters_like, broken], reward_inputs())


def letters_like(completions, **kwargs):
    return [1.0] * len(completions)


def test_log_metric_and_extra_keyword_arguments():
    def logs(completions, log_metric, log_extra, trainer_state, **kwargs):
        log_metric("answer_rate", 0.25)
        log_metric("answer_rate", 0.75)
        log_extra("note", ["x"] * len(completions))
        return [float(trainer_state)] * len(completions)

    inputs = reward_inputs()
    inputs.extra["environments"] = list(range(len(PROMPTS)))
    assert score_completions([logs], inputs, trainer_state=3)[:, 0].tolist() == [3.0] * len(PROMPTS)
    assert inputs.metric_means() == {"answer_rate": 0.5}
