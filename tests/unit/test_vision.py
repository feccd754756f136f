"""ImageBatch: each sample's image inputs select, concatenate, move and round-trip through a checkpoint's named
tensors like the [N, ...] fields of a rollout."""

import pytest
import torch

from steadyrl.rollout import Rollout
from steadyrl.vision import ImageBatch


def samples():
    """Three samples: 2, 0 and 3 patch rows, 1, 0 and 1 grids, prompts of 3, 2 and 4 tokens."""
    rows = [2, 0, 3]
    return [
        {
            "pixel_values": torch.arange(r * 4, dtype=torch.float32).view(r, 4) + 100 * i,
            "image_grid_thw": torch.tensor([[1, 1, r]]) if r else torch.zeros(0, 3, dtype=torch.long),
            "mm_token_type_ids": torch.tensor([0] + [1] * (i + 1) + [0]),
        }
        for i, r in enumerate(rows)
    ]


def test_of_samples_keeps_each_samples_rows_and_left_pads_token_aligned_inputs():
    batch = ImageBatch.of_samples(samples(), width=5, sources=[["a"], [], ["b"]])
    assert batch.counts["pixel_values"].tolist() == [2, 0, 3]
    assert batch.rows["pixel_values"].shape == (5, 4)
    assert batch.tokens["mm_token_type_ids"].tolist() == [[0, 0, 0, 1, 0], [0, 0, 1, 1, 0], [0, 1, 1, 1, 0]]
    assert len(batch) == 3


@pytest.mark.parametrize("index", [torch.tensor([2, 0]), slice(1, 3)])
def test_select_takes_the_rows_of_the_chosen_samples_in_order(index):
    batch = ImageBatch.of_samples(samples(), width=5, sources=[["a"], [], ["b"]])
    chosen = batch.select(index)
    order = index.tolist() if isinstance(index, torch.Tensor) else list(range(3))[index]
    expected = torch.cat([samples()[i]["pixel_values"] for i in order])
    assert torch.equal(chosen.rows["pixel_values"], expected)
    assert chosen.counts["image_grid_thw"].tolist() == [len(samples()[i]["image_grid_thw"]) for i in order]
    assert torch.equal(chosen.tokens["mm_token_type_ids"], batch.tokens["mm_token_type_ids"][order])
    assert chosen.sources == [[["a"], [], ["b"]][i] for i in order]


def test_concatenate_pads_the_narrower_tokens_and_is_the_inverse_of_select():
    whole = ImageBatch.of_samples(samples(), width=5)
    first, rest = ImageBatch.of_samples(samples()[:1], width=3), ImageBatch.of_samples(samples()[1:], width=5)
    joined = ImageBatch.concatenate([first, rest])
    for name in whole.rows:
        assert torch.equal(joined.rows[name], whole.rows[name]) and torch.equal(joined.counts[name], whole.counts[name])
    assert torch.equal(joined.tokens["mm_token_type_ids"], whole.tokens["mm_token_type_ids"])


def test_model_inputs_fit_tokens_to_the_prompt_and_zero_the_completion():
    batch = ImageBatch.of_samples(samples(), width=5)
    inputs = batch.model_inputs(prompt_width=4, completion_width=2)
    assert inputs["mm_token_type_ids"].tolist() == [[0, 0, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert inputs["pixel_values"] is batch.rows["pixel_values"]


def test_a_rollout_with_images_round_trips_through_its_named_tensors_and_selects_its_images():
    n = 3
    rollout = Rollout(
        prompt_ids=torch.ones(n, 5, dtype=torch.long),
        prompt_mask=torch.ones(n, 5, dtype=torch.long),
        completion_ids=torch.ones(n, 2, dtype=torch.long),
        completion_mask=torch.ones(n, 2, dtype=torch.long),
        scores=torch.arange(n, dtype=torch.float32),
        images=ImageBatch.of_samples(samples(), width=5, sources=[["a"], [], ["b"]]),
    )
    named = rollout.tensors()
    assert all(isinstance(value, torch.Tensor) for value in named.values())  # safetensors can store them
    back = Rollout.from_tensors(named)
    assert back.images.sources is None  # the tensors are what a resume needs; the source images are not stored
    assert all(torch.equal(back.images.rows[k], rollout.images.rows[k]) for k in rollout.images.rows)
    picked = back.select(torch.tensor([2]))
    assert picked.scores.tolist() == [2.0] and picked.images.counts["pixel_values"].tolist() == [3]
    trimmed = picked.trimmed()
    assert trimmed.images.tokens["mm_token_type_ids"].shape[1] == trimmed.prompt_ids.shape[1]


def test_the_completion_log_shows_an_images_tokens_as_one_and_carries_the_images_with_log_multimodal():
    from steadyrl.rollout import completion_rows
    from steadyrl.toy.vision import build_vision_tokenizer

    tokenizer = build_vision_tokenizer()
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    prompt = tokenizer("look: ")["input_ids"] + [pad] * 4 + tokenizer(" ok?")["input_ids"]
    completion = tokenizer("red")["input_ids"]
    rollout = Rollout(
        prompt_ids=torch.tensor([prompt]),
        prompt_mask=torch.ones(1, len(prompt), dtype=torch.long),
        completion_ids=torch.tensor([completion]),
        completion_mask=torch.ones(1, len(completion), dtype=torch.long),
        scores=torch.tensor([1.0]),
        images=ImageBatch.of_samples(samples()[:1], width=len(prompt), sources=[["IMAGE"]]),
    )
    [row] = completion_rows(rollout, tokenizer, [], None, image_token_ids=(pad,), with_images=True)
    assert row["prompt"] == "look: <|image_pad|> ok?" and row["completion"] == "red"
    assert row["images"] == ["IMAGE"]
    [row] = completion_rows(rollout, tokenizer, [], None, image_token_ids=(pad,))
    assert "images" not in row
