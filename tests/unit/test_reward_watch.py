"""Reward calls that run long (steadyrl/reward_watch.py), on the main thread as a trainer makes them: warned about
with the function, the step and the line it is at; interrupted at reward_timeout; and ended by a stop signal that
comes past the threshold with the exit status of a stopped run. In runs: tests/integration/resume/test_faults.py."""

from __future__ import annotations

import logging
import signal
import time

import pytest

from steadyrl import reward_watch
from steadyrl.reward_checks import RewardFunctionError
from steadyrl.reward_watch import StoppedInRewardFunction, stop_during_reward_call, watched

pytestmark = pytest.mark.skipif(reward_watch.INTERRUPT_SIGNAL is None, reason="needs real-time signals")


def named(name: str):
    return lambda: f"reward function {name!r}"


def test_a_call_past_reward_timeout_is_interrupted_and_named():
    started = time.monotonic()
    with pytest.raises(
        RewardFunctionError,
        match=r"reward function 'hangs' did not return within reward_timeout=0.2 seconds at global step 7: it was "
        "interrupted",
    ):
        watched(lambda: time.sleep(30), named("hangs"), step=7, timeout=0.2)
    assert time.monotonic() - started < 10


def test_a_slow_call_is_warned_about_with_the_line_it_is_at(monkeypatch, caplog):
    monkeypatch.setattr(reward_watch, "HANG_WARNING_S", 0.1)

    def slow_reward():
        time.sleep(0.35)  # past the threshold, then twice it
        return [1.0]

    with caplog.at_level(logging.WARNING, logger="steadyrl.reward_watch"):
        assert watched(slow_reward, named("slow"), step=2, timeout=None) == [1.0]
    warnings = [r.getMessage() for r in caplog.records if "has been running for" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "reward function 'slow' has been running for 0.1 s at global step 2" in warnings[0]
    assert "test_reward_watch.py" in warnings[0] and "in slow_reward" in warnings[0]


def test_a_stop_signal_past_the_threshold_ends_the_call_as_a_stopped_run(monkeypatch):
    monkeypatch.setattr(reward_watch, "HANG_WARNING_S", 0.05)

    def stopped_reward():
        time.sleep(0.1)
        stop_during_reward_call(signal.SIGTERM)  # what the trainer's SIGTERM handler calls
        return [1.0]

    with pytest.raises(StoppedInRewardFunction) as stopped:
        watched(stopped_reward, named("stopped"), step=4, timeout=None)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert stop_during_reward_call(signal.SIGTERM) is None, "outside a reward call the handler goes on as usual"
