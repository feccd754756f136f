"""checkpoint/health.py: a written checkpoint read back for non-finite numbers (one without the mark of a checked
save), and the in-memory refusals a save makes."""

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from steadyrl.checkpoint.health import CHECKED_KEY, nonfinite_in_checkpoint, refuse_nonfinite_weights
from steadyrl.ops.finite import NonFiniteError


def write_checkpoint(directory, weight: float, moment: float, coef: float, checked: bool = False):
    directory.mkdir()
    save_file({"lm_head.weight": torch.full((2, 2), weight)}, directory / "model.safetensors")
    save_file({"critic.weight": torch.ones(2)}, directory / "critic_model.safetensors")
    save_file({"rollout.reward_scores": torch.tensor([math.nan])}, directory / "rollout_buffer_0.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.full((2,), moment)}}}, directory / "optimizer.pt")
    state = {"format": 5, "fingerprint": {}, "algorithm": {"kl_coef": coef}}
    if checked:
        state[CHECKED_KEY] = True
    (directory / "steadyrl_state.json").write_text(json.dumps(state))
    return directory


def test_weights_optimizer_state_and_shared_loop_state_are_read_back(tmp_path):
    assert nonfinite_in_checkpoint(write_checkpoint(tmp_path / "ok", 1.0, 0.5, 0.1)) == []  # a None reward: NaN, fine
    bad = write_checkpoint(tmp_path / "bad", math.nan, math.inf, math.nan)
    assert nonfinite_in_checkpoint(bad) == [
        "steadyrl_state.json:algorithm.kl_coef",
        "model.safetensors:lm_head.weight",
        "optimizer.pt:state.0.exp_avg (2 of 2)",
    ]


def test_a_checkpoint_checked_as_it_was_saved_is_not_read_again(tmp_path):
    assert nonfinite_in_checkpoint(write_checkpoint(tmp_path / "c", math.nan, 0.5, 0.1, checked=True)) == []


def test_a_models_own_share_of_its_weights_is_refused_with_its_name():
    model = torch.nn.Linear(3, 2)
    refuse_nonfinite_weights(model, "actor")
    with torch.no_grad():
        model.bias[1] = math.inf
    with pytest.raises(NonFiniteError, match=r"^Refused to save the actor's weights: bias \(1 of 2\) hold NaN"):
        refuse_nonfinite_weights(model, "actor")
