"""Tools whose replies hold images (TRL's multimodal tool replies) with a vision-language model: the Qwen2.5-VL
stand-in that calls tools (steadyrl.toy.vision.vision_tool_model_path), with prompts of text only, so that every
image it sees comes from a tool. The reply's images are read when the next turn is generated and in every scoring
and training pass, at the positions the model gives them."""

import torch
from support.toy_run import make_trainer, vision_task

from steadyrl.ops.logprobs import completion_logprobs
from steadyrl.toy.tools import sum_rows


def left_padded(rows: list[list[int]], pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids, mask = torch.full((len(rows), width), pad), torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span], mask[i, span] = torch.tensor(row), 1
    return ids, mask


def direct_logprobs(model, processor, ids: list[int], prompt_length: int, images: list) -> torch.Tensor:
    """One row's completion log-probs from one unpadded forward of the whole conversation with its images."""
    pixels = processor.image_processor(images=images, return_tensors="pt")
    input_ids = torch.tensor([ids])
    image_tokens = torch.isin(input_ids, torch.tensor([model.config.image_token_id])).long()
    with torch.no_grad():
        logits = model(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"],
            mm_token_type_ids=image_tokens,
        ).logits[0, prompt_length - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, input_ids[0, prompt_length:, None])[:, 0]


def test_a_tool_replys_image_is_read_where_its_tokens_are(tmp_path):
    task = vision_task("tools")
    trainer = make_trainer(tmp_path, algorithm="grpo", **task, max_steps=1)
    processor, model = task["processing_class"], trainer.model.eval()
    prompts = [row["prompt"] for row in sum_rows(4, seed=3) for _ in range(2)]
    _, prompt_ids, _, out = trainer.rollout_source.complete(prompts, {}, list(range(8)), version=0)
    image_id = model.config.image_token_id
    with_images = [i for i, ids in enumerate(out.completion_ids) if image_id in ids]
    assert len(with_images) >= 2, "the stand-in made too few tool calls to check"
    shown = [len(out.images.sources[i]) for i in range(8)]
    assert all(shown[i] >= 1 for i in with_images) and sum(shown) == sum(
        m["content"][0]["type"] == "image" for c in out.completions for m in c if m["role"] == "tool"
    ), "each sample holds the images of its own tool replies"
    for i, ids in enumerate(out.completion_ids):  # the replies' ids are the environment's: no gradient
        assert all(mask == 0 for token, mask in zip(ids, out.env_mask[i]) if token == image_id)

    tokenizer = processor.tokenizer
    prompt, prompt_mask = left_padded(prompt_ids, tokenizer.pad_token_id, left=True)
    completion, completion_mask = left_padded(out.completion_ids, tokenizer.pad_token_id, left=False)
    with torch.no_grad():
        batched, _ = completion_logprobs(model, prompt, prompt_mask, completion, completion_mask, images=out.images)
    for i in with_images:
        ids, length = prompt_ids[i] + out.completion_ids[i], len(prompt_ids[i])
        expected = direct_logprobs(model, processor, ids, length, out.images.sources[i])
        assert (batched[i, : len(expected)] - expected).abs().max() < 1e-4, f"row {i}: padded batch vs one forward"
        grey = [image.point(lambda v: 128) for image in out.images.sources[i]]
        other = direct_logprobs(model, processor, ids, length, grey)
        assert (other - expected).abs().max() > 1e-3, "the check is blind: the model ignores the reply's image"


def test_the_vision_tower_learns_from_tool_replies_alone(tmp_path):
    """The prompts have no images: a gradient reaches the vision tower only through the tool replies' images."""
    trainer = make_trainer(tmp_path, algorithm="grpo", **vision_task("tools"), max_steps=2)
    tower = {name: p.detach().clone() for name, p in trainer.model.model.visual.named_parameters()}
    trainer.train()
    history = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]
    assert history and history[-1]["tools/call_frequency"] > 0 and history[-1]["env_token_share"] > 0
    changed = [name for name, p in trainer.model.model.visual.named_parameters() if not torch.equal(p, tower[name])]
    assert len(changed) == len(tower), f"vision tower parameters left unchanged: {sorted(set(tower) - set(changed))}"
