"""ops/finite.py: which tensors and numbers hold a NaN or an infinity, and the refusal that names them."""

import math

import pytest
import torch

from steadyrl.ops.finite import NonFiniteError, nonfinite_numbers, nonfinite_tensors, refuse_nonfinite


def test_each_non_finite_tensor_is_named_with_its_count_and_others_are_not():
    bad = torch.zeros(4, 3)
    bad[0, 1], bad[2, 2] = math.nan, -math.inf
    named = [("ok", torch.ones(5)), ("bad", bad), ("ids", torch.tensor([1, 2])), ("empty", torch.zeros(0))]
    assert nonfinite_tensors(named) == ["bad (2 of 12)"]
    assert nonfinite_tensors([("half", torch.tensor([65504.0, math.inf], dtype=torch.float16))]) == ["half (1 of 2)"]


def test_a_nested_state_is_searched_through_dicts_lists_tensors_and_floats():
    state = {
        "state": {0: {"exp_avg": torch.tensor([1.0, math.nan]), "step": torch.tensor(3.0)}},
        "param_groups": [{"lr": 0.1, "betas": (0.9, math.inf)}],
        "count": 3,
    }
    assert sorted(nonfinite_numbers(state)) == ["param_groups.0.betas.1", "state.0.exp_avg (1 of 2)"]
    assert nonfinite_numbers({"kl_coef": 0.05, "moments": {"mean": 1.0, "var": 2.0}}) == []


def test_the_refusal_names_at_most_five_and_counts_the_rest():
    named = [(f"w{i}", torch.tensor([math.nan])) for i in range(7)]
    with pytest.raises(NonFiniteError, match=r"^The actor: w0 \(1 of 1\), .*w4 \(1 of 1\) and 2 more hold NaN"):
        refuse_nonfinite(named, "The actor")
    refuse_nonfinite([("w", torch.ones(2))], "The actor")  # finite: nothing raised
