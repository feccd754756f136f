"""Partial rollouts' pure parts: which completions are continued, and a head, its middle segments and its tail joined
into one completion whose tokens name the weight version that sampled them."""

import dataclasses

from steadyrl.generation import Generation
from steadyrl.rollout import SampledRollout
from steadyrl.trainers.loop.partial_rollouts import tail_seed, unfinished, with_segment, with_tails


def heads() -> SampledRollout:
    """3 samples' first 2 tokens at global step 4: the first ended (EOS 0), the second ran to 2, the third stopped
    early at a stop string."""
    return SampledRollout(
        version=4,
        prompts=["a", "a", "b"],
        columns={},
        prompt_ids=[[1], [1], [2]],
        completion_ids=[[5, 0], [6, 7], [8]],
        logprobs=[[-0.1, -0.2], [-0.3, -0.4], [-0.5]],
        scores=None,
        metrics={"prompts_truncated": 0.0},
        generation_time=1.0,
        stopped=[True, False, True],
        seeds=[11, 12, 13],
    )


def test_only_a_head_that_ran_to_its_length_without_ending_is_continued():
    assert unfinished(heads(), 2, limit=8) == [1]
    cut_by_the_model_length = dataclasses.replace(
        heads(), stopped=[True, False, False], completion_ids=[[5, 0], [6], [8]]
    )
    assert unfinished(cut_by_the_model_length, 2, limit=8) == [], "a head shorter than the segment cannot go on"
    assert unfinished(heads(), 2, limit=2) == [], "a head already at max_completion_length is whole"


def test_a_middle_segment_continues_with_its_own_version_and_a_tail_ends_it():
    middle = with_segment(heads(), [1], Generation([[9, 10]], [[-0.6, -0.7]], stopped=[False]), version=6)
    assert middle.completion_ids[1] == [6, 7, 9, 10] and middle.versions[1] == [[0, 4], [2, 6]]
    assert middle.stopped == [True, False, True] and middle.seeds == heads().seeds, "still waiting for its tail"
    assert unfinished(middle, 2, limit=8) == [1], "ran its 2 segments to 4 tokens without ending"
    whole = with_tails(middle, [1], Generation([[11, 0]], [[-0.8, -0.9]], stopped=[True]), version=8)
    assert whole.completion_ids[1] == [6, 7, 9, 10, 11, 0]
    assert whole.versions[1] == [[0, 4], [2, 6], [4, 8]] and whole.logprobs[1][-2:] == [-0.8, -0.9]
    assert whole.metrics["async/partial/versions_max"] == 3
    assert tail_seed(12, 1) != tail_seed(12, 2) != tail_seed(12), "each segment samples with a seed of its own"


def test_a_tail_joins_its_head_with_its_own_version_and_log_probs():
    tails = Generation([[9, 10, 0]], [[-0.6, -0.7, -0.8]], stopped=[True])
    whole = with_tails(heads(), [1], tails, version=8)
    assert whole.completion_ids == [[5, 0], [6, 7, 9, 10, 0], [8]]
    assert whole.logprobs[1] == [-0.3, -0.4, -0.6, -0.7, -0.8]
    assert whole.versions == [[[0, 4]], [[0, 4], [2, 8]], [[0, 4]]]
    assert whole.stopped is None and whole.seeds is None, "no longer waiting for the hand-over"
    assert whole.metrics["async/partial/continued_share"] == 1 / 3
    assert whole.metrics["async/partial/fresh_token_share"] == 3 / 8
    assert whole.metrics["async/partial/versions_max"] == 2
    assert heads().completion_ids[1] == [6, 7], "the heads are not changed"


def test_a_tail_seed_is_stable_and_differs_from_its_heads():
    assert tail_seed(12) == tail_seed(12) and tail_seed(12) != 12 and tail_seed(12) != tail_seed(13)
    assert 0 <= tail_seed(2**63 - 1) < 2**63
