"""A resume with another number of total steps: which learning-rate schedules it changes, and what it says."""

import pytest
from transformers import TrainingArguments

from steadyrl.checkpoint.schedule_change import schedule_change


def args(scheduler: str, **kwargs) -> TrainingArguments:
    return TrainingArguments(
        output_dir="unused", learning_rate=1e-5, lr_scheduler_type=scheduler, report_to="none", **kwargs
    )


def test_extending_a_linear_run_states_both_learning_rates():
    # the case: saved at step 500 of 1000, resumed for 2000 steps: 0.75x the peak rate instead of 0.5x
    message = schedule_change(args("linear"), 500, 1000, 2000)
    assert (
        "at step 500 the learning rate is 7.5e-06, where the schedule of the run that wrote the checkpoint gives 5e-06"
        in message
        and "resume with max_steps=1000" in message
    )


def test_a_warmup_ratio_moves_with_the_horizon():
    message = schedule_change(args("constant_with_warmup", warmup_steps=0.1), 50, 1000, 2000)
    assert "warmup 100 -> 200 steps" in message and "at step 50 the learning rate is 2.5e-06" in message
    assert schedule_change(args("constant_with_warmup", warmup_steps=0.1), 500, 1000, 2000) is None  # warmed up


@pytest.mark.parametrize("scheduler", ["constant", "constant_with_warmup"])
def test_a_schedule_that_does_not_depend_on_the_horizon_stays_free(scheduler):
    assert schedule_change(args(scheduler, warmup_steps=10), 500, 1000, 2000) is None
    assert schedule_change(args(scheduler, warmup_steps=10), 5, 1000, 2000) is None


def test_the_same_horizon_or_a_cosine_run_shortened_past_its_steps():
    assert schedule_change(args("cosine"), 500, 1000, 1000) is None
    assert "at step 500 the learning rate is" in schedule_change(args("cosine"), 500, 1000, 800)
    assert schedule_change(args("cosine"), 900, 1000, 800) is None  # no step left to take
