"""The rollout types on their own: a rollout generated ahead survives its checkpoint's JSON (a tool loop's
trajectories with their conversations too), one stored with keys this version does not know is refused by name, and
a whole rollout splits into each process's share as a draw on that many processes would."""

import dataclasses
import json

import pytest

from steadyrl.rollout import SampledRollout
from steadyrl.trainers.loop.ahead_request import share_of


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


def trajectories() -> SampledRollout:
    """Two samples of a tool loop: the second called a tool (its reply's tokens are the environment's)."""
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    conversations = [
        [{"role": "assistant", "content": "3"}],
        [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "name": "add", "content": "3"}],
    ]
    return dataclasses.replace(
        sampled(),
        completion_ids=[[4], [5, 6, 7]],
        logprobs=[[-0.5], [-0.1, 0.0, -0.2]],
        env_mask=[[1], [1, 0, 1]],
        completions=conversations,
    )


def test_a_tool_loops_rollout_comes_back_from_its_json_with_its_mask_and_conversations():
    state = json.loads(json.dumps(trajectories().state_dict()))
    assert SampledRollout.from_state_dict(state) == trajectories()


def test_each_process_gets_its_samples_of_a_whole_rollout_with_their_masks_and_conversations():
    whole = trajectories()
    shares = [share_of(whole, rank, 2) for rank in range(2)]
    assert [share.prompts for share in shares] == [["a"], ["b"]]
    assert [share.env_mask for share in shares] == [[[1]], [[1, 0, 1]]]
    assert shares[1].completions == whole.completions[1:] and shares[1].scores == [[None]]
    assert share_of(whole, 0, 1) is whole


def test_a_stored_rollout_with_keys_this_version_does_not_know_is_refused_naming_them():
    state = {**sampled().state_dict(), "weights_version": 3}
    del state["generation_time"]
    with pytest.raises(ValueError, match=r"SampledRollout.from_state_dict: .* has keys \['weights_version'\]") as err:
        SampledRollout.from_state_dict(state)
    assert "lacks ['generation_time']" in str(err.value) and "'completion_ids', 'logprobs'" in str(err.value)
