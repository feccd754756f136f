"""The map-style prompt sampler (steadyrl/data/sampling.py): seeded permutations epoch after epoch, each prompt once
per epoch, a state that resumes at the exact prompt, and a checkpoint of another dataset refused."""

from __future__ import annotations

import json

import pytest

from steadyrl.data.sampling import PromptSampler, make_sampler, next_rows
from steadyrl.data.stream import StreamSampler
from steadyrl.toy import toy_dataset


def test_each_epoch_is_a_seeded_permutation_of_every_prompt():
    sampler = PromptSampler(num_prompts=6, seed=3)
    first, second = sampler.next(6), sampler.next(6)
    assert sorted(first) == sorted(second) == list(range(6)) and first != second, "reshuffled each epoch"
    assert PromptSampler(6, seed=3).next(12) == first + second, "the same seed draws the same order"
    assert PromptSampler(6, seed=4).next(6) != first
    assert PromptSampler(6, seed=3, shuffle=False).next(8) == [0, 1, 2, 3, 4, 5, 0, 1]
    assert sampler.epoch == 2.0


def test_a_restored_sampler_draws_what_the_uninterrupted_one_would():
    sampler = PromptSampler(num_prompts=5, seed=0)
    sampler.next(7)  # into the second epoch
    restored = PromptSampler(num_prompts=5, seed=99)  # the checkpoint's seed wins
    restored.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert restored.next(9) == sampler.next(9)


def test_a_checkpoint_of_another_dataset_is_refused():
    state = PromptSampler(num_prompts=5, seed=0).state_dict()
    with pytest.raises(ValueError, match="covered 5 prompts, but train_dataset has 6"):
        PromptSampler(num_prompts=6, seed=0).load_state_dict(state)
    stream_state = {"epoch": 0, "rows_in_epoch": 2, "consumed": 2}
    with pytest.raises(ValueError, match="read a streaming datasets.IterableDataset, but train_dataset is now"):
        PromptSampler(num_prompts=6, seed=0).load_state_dict(stream_state)


def test_every_process_draws_the_whole_rollout_and_keeps_its_part():
    """The position is the same on every process; each keeps its slice of the rows, with their indices."""
    dataset = toy_dataset(num_prompts=8)
    samplers = [make_sampler(dataset, seed=1, shuffle=True) for _ in range(2)]
    assert all(isinstance(s, PromptSampler) for s in samplers)
    parts = [next_rows(sampler, dataset, 4, part) for sampler, part in zip(samplers, (slice(0, 2), slice(2, 4)))]
    whole_rows, whole_indices = next_rows(make_sampler(dataset, seed=1, shuffle=True), dataset, 4, slice(None))
    assert parts[0][1] + parts[1][1] == whole_indices
    assert parts[0][0]["prompt"] + parts[1][0]["prompt"] == whole_rows["prompt"]
    assert samplers[0].consumed == samplers[1].consumed == 4
    assert isinstance(make_sampler(dataset.to_iterable_dataset(), seed=1, shuffle=True), StreamSampler)
