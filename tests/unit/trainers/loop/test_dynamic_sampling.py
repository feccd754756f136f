"""Dynamic sampling's pure parts: which groups carry a signal, which kept groups make the rollout on each process
(the same rollout on any number of processes), and the rows that travel between processes."""

import math

import pytest
import torch

from steadyrl.agents.turns import Trajectories
from steadyrl.distributed.metrics import combine_by_name
from steadyrl.generation import Generation
from steadyrl.trainers.loop.dynamic_sampling import (
    fill_order,
    groups_with_signal,
    sample_rows,
    sampled_from_rows,
)
from steadyrl.trainers.loop.sources import Sampled


def test_a_group_has_a_signal_when_its_rewards_are_not_all_equal():
    totals = torch.tensor([1.0, 1.0, 0.0, 1.0, -0.5, -0.5, 0.3, 0.30001])  # groups of k=2
    assert groups_with_signal(totals, 2).tolist() == [False, True, False, True]
    assert groups_with_signal(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1e-9]), 3).tolist() == [False, True]


def keys_of(keep_per_draw: list[list[bool]], processes: int) -> list[tuple[int, int, int]]:
    """The kept groups' keys (draw, process, group) of batches of drawn groups split among ``processes``, each
    process holding a contiguous share of the batch, as PromptDraw splits it."""
    keys = []
    for draw, keep in enumerate(keep_per_draw):
        share = len(keep) // processes
        keys += [(draw, g // share, g % share) for g, kept in enumerate(keep) if kept]
    return keys


def global_groups(keys: list[tuple[int, int, int]], processes: int, batch: int) -> list[tuple[int, int]]:
    """(draw, the group's place in its drawn batch) of keys on ``processes`` processes."""
    share = batch // processes
    return [(draw, process * share + group) for draw, process, group in keys]


KEEP = [  # 3 draws of 8 prompts: 3 kept, then 2, then 5 (the rollout of 8 is full after the third draw)
    [True, False, False, True, False, False, True, False],
    [False, False, True, False, False, True, False, False],
    [True, True, False, True, True, False, True, False],
]


@pytest.mark.parametrize("processes", [1, 2, 4, 8])
def test_the_rollout_is_the_first_kept_groups_in_draw_order_on_any_number_of_processes(processes):
    keys = keys_of(KEEP, processes)
    rollout = [key for rank in range(processes) for key in fill_order(keys, 8, processes, rank)]
    expected = [(0, 0), (0, 3), (0, 6), (1, 2), (1, 5), (2, 0), (2, 1), (2, 3)]  # (2, 4) and (2, 6): unused
    assert global_groups(rollout, processes, 8) == expected
    # each process gets an equal, contiguous share, in order, whatever order the keys were gathered in
    shares = [fill_order(list(reversed(keys)), 8, processes, rank) for rank in range(processes)]
    assert all(len(share) == 8 // processes for share in shares)
    assert [key for share in shares for key in share] == rollout


def rows_and_back(generation: Generation):
    sampled = Sampled(
        prompts=["ab:", "ab:", "cd:", "cd:"],
        columns={"letters": ["ab", "ab", "cd", "cd"]},
        prompt_ids=[[1, 2], [1, 2], [3, 4], [3, 4]],
        generation=generation,
        generation_time=1.0,
    )
    scores = torch.tensor([[0.0, math.nan], [1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    rows = sample_rows(sampled, scores)
    back, back_scores = sampled_from_rows(rows[2:], 2.5, {"m": 1.0})
    assert back.prompts == ["cd:", "cd:"] and back.columns == {"letters": ["cd", "cd"]}
    assert back.prompt_ids == [[3, 4], [3, 4]] and back.generation_time == 2.5 and back.metrics == {"m": 1.0}
    assert torch.equal(back_scores, scores[2:])
    assert rows[1]["scores"].untyped_storage().size() == scores[1].nbytes  # a row does not carry the whole tensor
    return back.generation


def test_rows_keep_what_the_scoring_passes_read():
    plain = rows_and_back(Generation([[5], [6, 7], [8], [9, 9]], [[-0.1], [-0.2, -0.3], [-0.4], [-0.5, -0.6]]))
    assert (
        type(plain) is Generation and plain.completion_ids == [[8], [9, 9]] and plain.logprobs == [[-0.4], [-0.5, -0.6]]
    )
    turns = Trajectories([[5], [6], [7, 1], [8, 2]], None, env_mask=[[1], [1], [1, 0], [1, 0]], completions=["x"] * 4)
    back = rows_and_back(turns)
    assert back.env_mask == [[1, 0], [1, 0]] and back.logprobs is None and back.completion_ids == [[7, 1], [8, 2]]


def test_metrics_of_several_draws_are_their_means_over_the_draws_that_logged_them():
    draws = [{"a": 1.0, "b": 2.0}, {"a": 3.0}, {"a": 5.0, "c": 7.0}]  # combined as processes are
    assert combine_by_name(draws) == {"a": 3.0, "b": 2.0, "c": 7.0}
