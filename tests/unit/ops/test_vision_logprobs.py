"""Log-probs of completions after prompts with images: a left-padded micro-batch of prompts of different lengths
gives each sample the log-probs the model gives it alone, called as transformers calls it (positions, Qwen's
image-derived mrope included, skip the padding), and the loss's gradient reaches the vision tower."""

import pytest
import torch

from steadyrl.data.images import encode_prompts, prompts_with_images
from steadyrl.ops import pad_prompts_and_completions
from steadyrl.ops.logprobs import batched_logprobs, completion_logprobs
from steadyrl.toy.vision import build_processor, build_vision_model, colour_dataset
from steadyrl.vision import ImageBatch


def batch(family):
    processor, rows = build_processor(family), colour_dataset(3)
    prompts = prompts_with_images(rows["prompt"], rows["image"], "image")
    prompts[1] = [{"role": "system", "content": "Answer in one word, please."}, *prompts[1]]  # a longer prompt
    ids, inputs = encode_prompts(prompts, processor, None)
    generator = torch.Generator().manual_seed(0)
    completions = [torch.randint(4, 60, (length,), generator=generator).tolist() for length in (5, 3, 4)]
    tokens = pad_prompts_and_completions(ids, completions, processor.tokenizer.pad_token_id, "cpu")
    model = build_vision_model(processor.tokenizer, family).eval()
    images = ImageBatch.of_samples(inputs, max(map(len, ids)))
    return model, tokens, images, ids


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_next"])
def test_a_padded_batch_gives_each_sample_its_own_logprobs(family):
    model, tokens, images, ids = batch(family)
    prompt_ids, prompt_mask, completion_ids, completion_mask = tokens.values()
    together, _ = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, images=images)
    assert len({len(p) for p in ids}) > 1, "the prompts must differ in length for the padding to matter"
    for i, prompt in enumerate(ids):
        width, length = len(prompt), int(completion_mask[i].sum())
        completion = completion_ids[i, :length]
        input_ids = torch.cat([torch.tensor(prompt), completion])[None]
        extra = images.select(slice(i, i + 1)).model_inputs(width, length)
        with torch.no_grad():  # the model's own forward: it computes its positions
            logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **extra).logits
        alone = logits[0, width - 1 : -1].log_softmax(-1).gather(1, completion[:, None])[:, 0]
        torch.testing.assert_close(together[i, :length], alone, rtol=0, atol=1e-5)
    # the scoring passes' micro-batches (rows reordered by length, chunks trimmed) agree too
    chunked = batched_logprobs(model, tuple(tokens.values()), 1.0, batch_size=2, images=images)
    torch.testing.assert_close(chunked * completion_mask, together * completion_mask, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_next"])
def test_the_loss_gradient_reaches_the_vision_tower(family):
    model, tokens, images, _ = batch(family)
    logprobs, _ = completion_logprobs(model, *tokens.values(), images=images)
    (logprobs * tokens["completion_mask"]).sum().backward()
    tower = model.model.visual if family == "qwen2_5_vl" else model.model.vision_tower
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tower.parameters())


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_next"])
def test_a_packed_pass_encodes_each_groups_images_once_and_equals_the_padded_pass(family):
    model, tokens, images, _ = batch(family)
    rows = torch.tensor([0, 0, 0, 1, 1, 2])  # 3 groups: each a prompt with its image, and its completions
    tokens = {name: value[rows].clone() for name, value in tokens.items()}
    tokens["completion_ids"][1:3, :2] = torch.tensor([[5, 6], [7, 8]])  # a group's completions differ
    images = images.select(rows)
    completion_logprobs(model, *tokens.values(), images=images, packing=True)  # the first: checked against padded
    tower = model.model.visual if family == "qwen2_5_vl" else model.model.vision_tower
    encoded = []
    handle = tower.register_forward_hook(lambda module, args, output: encoded.append(args[0].shape[0]))
    padded, _ = completion_logprobs(model, *tokens.values(), images=images)
    packed, _ = completion_logprobs(model, *tokens.values(), images=images, packing=True)
    handle.remove()
    mask = tokens["completion_mask"]
    torch.testing.assert_close(packed * mask, padded * mask, rtol=0, atol=1e-5)
    assert encoded[1] * 2 == encoded[0], "packed, the vision tower encodes 3 images (one per group), padded 6"
