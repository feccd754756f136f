"""The rollout types on their own: a rollout generated ahead survives its checkpoint's JSON, and one stored with keys
this version does not know is refused by name."""

import json

import pytest

from steadyrl.rollout import SampledRollout


def sampled() -> SampledRollout:
    return SampledRollout(
        version=4,
        prompts=["a", "b"],
        columns={"letters": ["x", "y"]},
        prompt_ids=[[1, 2], [3]],
        completion_ids=[[4], [5, 6]],
        logprobs=[[-0.5], [-0.1, -0.2]],
        scores=[[1.0], [None]],
        metrics={"reward": 0.5},
        generation_time=0.25,
    )


def test_a_rollout_generated_ahead_comes_back_from_its_json_as_it_was():
    state = json.loads(json.dumps(sampled().state_dict()))  # as the checkpoint part holds it
    assert SampledRollout.from_state_dict(state) == sampled()


def test_a_stored_rollout_with_keys_this_version_does_not_know_is_refused_naming_them():
    state = {**sampled().state_dict(), "weights_version": 3}
    del state["generation_time"]
    with pytest.raises(ValueError, match=r"SampledRollout.from_state_dict: .* has keys \['weights_version'\]") as err:
        SampledRollout.from_state_dict(state)
    assert "lacks ['generation_time']" in str(err.value) and "'completion_ids', 'logprobs'" in str(err.value)
