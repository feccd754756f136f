"""Prompts with images, TRL's way: an ``image`` or ``images`` column placed into conversational prompts, rendered by
the model's processor into token ids (image tokens expanded) and per-sample image inputs (``steadyrl.vision``)."""

from __future__ import annotations

import torch

from ..vision import TOKEN_ALIGNED, model_image_tokens

IMAGE_COLUMNS = ("image", "images")  # TRL's columns of a vision-language dataset
TEXT_INPUTS = ("input_ids", "attention_mask")
# families whose processors return image tensors with a batch dimension per prompt (pixel_values [B, I, ...] padded
# to the most images): steadyrl keeps each sample's image rows, which these do not split into
BATCHED_IMAGE_FAMILIES = ("idefics2", "idefics3", "smolvlm", "mllama")


def is_processor(processing_class) -> bool:
    """A multimodal processor (it holds the tokenizer and an image processor), not a tokenizer alone."""
    from transformers import ProcessorMixin

    return isinstance(processing_class, ProcessorMixin) and hasattr(processing_class, "image_processor")


def text_tokenizer(processing_class):
    """The tokenizer inside a processor, or the tokenizer itself."""
    return processing_class.tokenizer if is_processor(processing_class) else processing_class


def image_column(columns) -> str | None:
    found = [name for name in IMAGE_COLUMNS if name in columns]
    return found[0] if found else None


def with_images(messages: list[dict], images: list) -> list[dict]:
    """``messages`` with ``images`` placed as TRL places them (``prepare_multimodal_messages``): every content a list
    of blocks; the images fill the ``{"type": "image"}`` placeholders the messages have, in order, or, where they have
    none, go as ``{"type": "image", "image": ...}`` blocks before the first user message's text."""
    placed = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        placed.append({**message, "content": [dict(block) for block in content or []]})
    slots = [b for m in placed for b in m["content"] if b.get("type") == "image" and b.get("image") is None]
    if slots:
        if len(slots) != len(images):
            raise ValueError(
                f"a prompt has {len(slots)} image placeholder(s) ({{'type': 'image'}} blocks) but its row has "
                f"{len(images)} image(s): give as many images as placeholders."
            )
        for slot, image in zip(slots, images):
            slot["image"] = image
        return placed
    if not images:
        return placed
    for message in placed:
        if message["role"] == "user":
            message["content"] = [{"type": "image", "image": image} for image in images] + message["content"]
            return placed
    raise ValueError(
        f"a prompt with {len(images)} image(s) has no user message to place them in: its roles are "
        f"{[m['role'] for m in messages]}. Give each prompt a user turn."
    )


def prompts_with_images(prompts: list, images: list, column: str) -> list:
    """Each prompt with its row's images (``image``: one per row; ``images``: a list per row)."""
    if not all(isinstance(p, list) for p in prompts):
        raise ValueError(
            f"train_dataset has an {column!r} column, so its prompts must be conversations (lists of messages), as "
            "TRL requires for images: a prompt that is a string (a chat template applied already) has nowhere to "
            "place them. Give the raw messages and let the trainer apply the chat template."
        )
    rows = [[image] if column == "image" else list(image or []) for image in images]
    return [with_images(prompt, row) for prompt, row in zip(prompts, rows)]


def prompt_images(prompt) -> list:
    """The images placed in a conversational prompt, in order."""
    if not isinstance(prompt, list):
        return []
    return [
        block["image"]
        for message in prompt
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "image" and block.get("image") is not None
    ]


def has_images(prompts: list) -> bool:
    return any(prompt_images(prompt) for prompt in prompts)


def encode_prompts(
    prompts: list, processor, chat_template_kwargs: dict | None, tools_per_row: list | None = None
) -> tuple[list[list[int]], list[dict[str, torch.Tensor]]]:
    """Token ids and image inputs (one dict per prompt: token-aligned [P] and image rows [R, ...]) of conversational
    prompts with images (and each row's tools, if given); consecutive equal prompts (a group's samples) are processed
    once."""
    ids, inputs, previous = [], [], None
    for i, prompt in enumerate(prompts):
        tools = {} if tools_per_row is None or not tools_per_row[i] else {"tools": tools_per_row[i]}
        if prompt is not previous:
            previous = prompt
            text = processor.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=False, **tools, **(chat_template_kwargs or {})
            )
            images = prompt_images(prompt)
            out = processor(text=[text], images=[images] if images else None, return_tensors="pt")
            row_ids, extras = out["input_ids"][0].tolist(), image_inputs(out)
        ids.append(row_ids)
        inputs.append(extras)
    return ids, inputs


def image_inputs(out, start: int = 0) -> dict[str, torch.Tensor]:
    """One rendered sample's image inputs from the processor's output ``out`` (a batch of one): token-aligned ones
    [P - start] (from token ``start`` on), image rows [R, ...] as they are."""
    inputs = {}
    for name, value in out.items():
        if name in TEXT_INPUTS or not isinstance(value, torch.Tensor):
            continue
        aligned = name in TOKEN_ALIGNED and value.shape == out["input_ids"].shape
        inputs[name] = value[0, start:] if aligned else value
    return inputs


def image_token_ids(processor, model) -> list[int]:
    """The ids of the tokens that stand for image features: never sampled (a sampled one would not match them)."""
    ids = [*model_image_tokens(model), getattr(processor, "image_token_id", None)]
    return sorted({i for i in ids if isinstance(i, int) and i >= 0})


def check_family(model) -> None:
    """A family whose image inputs steadyrl cannot split per sample is refused, by name."""
    family = getattr(model.config, "model_type", "")
    if family in BATCHED_IMAGE_FAMILIES:
        raise ValueError(
            f"model is a {family} vision-language model, whose processor batches images per prompt (pixel_values "
            "[B, images, ...] padded to the most images): steadyrl does not train it yet. Supported families: "
            "Qwen2-VL, Qwen2.5-VL, Qwen3-VL/3.5, Gemma3, LLaVA and LLaVA-Next (docs/vision.md)."
        )
