"""UpdateGuard: which updates a step refuses, the streak that stops a run, and its state in a checkpoint."""

import math

import pytest

from steadyrl.trainers.loop.update_guard import NonFiniteUpdateError, UpdateGuard, verdicts


def test_a_module_is_refused_for_its_own_non_finite_loss_or_norm_only():
    losses = {"actor": 0.5, "critic": math.nan}
    assert verdicts(losses, {"actor": math.inf, "critic": 1.0}) == {"actor": "grad_norm inf", "critic": "loss nan"}
    assert verdicts({"actor": 0.5}, {"actor": None}) == {}  # DeepSpeed: the engine checks its own norm
    assert verdicts({"actor": -math.inf}, {"actor": 2.0}) == {"actor": "loss -inf"}


def test_the_step_past_the_limit_in_a_row_stops_and_an_applied_step_ends_the_streak():
    guard = UpdateGuard(limit=2)
    guard.record(3, {"actor": "grad_norm nan"}, [7, 9])
    guard.record(4, {}, [])  # applied: the streak ends
    guard.record(5, {"actor": "loss nan"}, [1])
    guard.record(6, {"critic": "grad_norm inf"}, [2])
    with pytest.raises(NonFiniteUpdateError) as raised:
        guard.record(7, {"actor": "grad_norm nan"}, [3])
    message = str(raised.value)
    assert message.startswith("3 global steps in a row had a non-finite loss or gradient")
    assert "step 6: the critic (grad_norm inf); prompts (dataset rows) [2]" in message and "step 3" not in message
    assert guard.total == 4


def test_limit_zero_stops_at_the_first():
    with pytest.raises(NonFiniteUpdateError):
        UpdateGuard(limit=0).record(1, {"actor": "loss nan"}, [])


def test_an_fp16_loss_scale_overflow_is_counted_but_no_fault():
    guard = UpdateGuard(limit=0)
    for step in range(1, 6):  # the scale search: gradients overflow, the losses are finite
        guard.record(step, {"actor": "grad_norm inf"}, [], loss_scaled=True)
    assert guard.total == 5 and guard.in_a_row == []
    with pytest.raises(NonFiniteUpdateError):
        guard.record(6, {"actor": "loss nan"}, [], loss_scaled=True)


def test_its_state_round_trips_through_json():
    import json

    guard = UpdateGuard(limit=3)
    guard.record(2, {"actor": "grad_norm nan"}, [4, 5])
    restored = UpdateGuard(limit=3)
    restored.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert restored.total == 1 and restored.in_a_row == guard.in_a_row
