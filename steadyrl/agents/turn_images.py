"""Images in multi-turn rollouts: a vision-language model's prompt images and the images tools return (TRL's
multimodal tool replies, ``[{"type": "image", "image": ...}, {"type": "text", "text": ...}]``).

A tool reply with images is rendered by the processor: its ids hold the images' expanded image tokens, and its image
inputs follow the row's earlier ones. Each turn is generated with every image the row has so far, and the trained
sample's image rows are its prompt's, then its replies', in order (``ImageBatch``); over the completion, the
token-aligned inputs are 1 on image tokens (``ImageBatch.model_inputs``).

Shapes: N rows; row i's prompt has P_i tokens, its context (prompt and completion so far) more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..data.images import image_inputs, prompt_images
from ..vision import TOKEN_ALIGNED, ImageBatch
from .chat_format import assistant_call_head, cut_after_eos


@dataclass
class ToolReply:
    """The ids that follow an assistant turn ending in EOS (the tool messages, then the next assistant opening),
    with the image inputs of the images in them (token-aligned [len(ids)], image rows [R, ...]) and the images."""

    ids: list[int]
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    images: list = field(default_factory=list)


def reply_with_images(processor, tool_messages: list[dict], chat_template_kwargs: dict) -> ToolReply | None:
    """``tool_messages`` rendered by the processor, their images expanded into image tokens; None when they hold no
    image (the tokenizer renders them: ``chat_format.tool_suffix_ids``). Cut after the stand-in assistant turn's
    EOS, as the text reply is."""
    images = prompt_images(tool_messages)
    if not images:
        return None
    head = assistant_call_head(tool_messages[0]["name"])

    def render(messages, images, generation_prompt):
        text = processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **chat_template_kwargs
        )
        batch = [images] if images else None
        return processor(text=[text], images=batch, add_special_tokens=False, return_tensors="pt")

    tokenizer = processor.tokenizer
    before = cut_after_eos(render(head, [], False)["input_ids"][0].tolist(), tokenizer.eos_token_id)
    out = render(head + tool_messages, images, True)
    after = out["input_ids"][0].tolist()
    if after[: len(before)] != before:
        raise ValueError("the chat template renders an assistant turn differently once a tool reply follows it")
    inputs = image_inputs(out, start=len(before))
    return ToolReply(after[len(before) :], inputs, images)


class TurnImages:
    """The image inputs of N multi-turn rows: each row's prompt's (``prompt``: an ``ImageBatch`` of the rows, or
    None for prompts without images), then its tool replies'. ``image_ids``: the model's image tokens."""

    def __init__(self, prompt: ImageBatch | None, prompt_ids: list[list[int]], image_ids: list[int]) -> None:
        n = len(prompt_ids)
        self.prompt_lengths = [len(ids) for ids in prompt_ids]
        self.prompt = prompt.samples(self.prompt_lengths) if prompt is not None else [{} for _ in range(n)]
        sources = prompt.sources if prompt is not None and prompt.sources is not None else None
        self.sources = [list(images) for images in sources] if sources is not None else [[] for _ in range(n)]
        self.replies: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(n)]
        self.image_ids = torch.tensor(image_ids, dtype=torch.long)
        self.token_names = {name for sample in self.prompt for name in sample if name in TOKEN_ALIGNED}

    def add(self, row: int, reply: ToolReply) -> None:
        """``reply``, appended to ``row``'s completion: its images come after the row's earlier ones."""
        if reply.images:
            self.replies[row].append({k: v for k, v in reply.inputs.items() if k not in TOKEN_ALIGNED})
            self.token_names.update(k for k in reply.inputs if k in TOKEN_ALIGNED)
            self.sources[row].extend(reply.images)

    def sample(self, row: int, context: list[int] | None) -> dict[str, torch.Tensor]:
        """``row``'s inputs: every image row so far; token-aligned over ``context`` (None: over the prompt)."""
        prompt, length = self.prompt[row], self.prompt_lengths[row]
        sample = {}
        for name in sorted({*prompt, *(k for reply in self.replies[row] for k in reply)} - self.token_names):
            sample[name] = torch.cat([part[name] for part in (prompt, *self.replies[row]) if name in part])
        rest = None if context is None else torch.isin(torch.tensor(context[length:], dtype=torch.long), self.image_ids)
        for name in sorted(self.token_names):
            head = prompt[name] if name in prompt else torch.zeros(length, dtype=torch.long)
            sample[name] = head if rest is None else torch.cat([head, rest.to(head.dtype)])
        return sample

    def has_images(self, rows: list[int]) -> bool:
        return any(self.sources[i] for i in rows) or any(self.prompt[i] for i in rows)

    def of_rows(self, rows: list[int], contexts: list[list[int]]) -> ImageBatch | None:
        """The image inputs to generate the next turn of ``rows`` from ``contexts``; None when none has an image."""
        if not self.has_images(rows):
            return None
        samples = [self.sample(i, context) for i, context in zip(rows, contexts)]
        return ImageBatch.of_samples(samples, max(map(len, contexts)), [list(self.sources[i]) for i in rows])

    def batch(self) -> ImageBatch | None:
        """The N trained samples' image inputs (token-aligned over the prompts); None when no row has an image."""
        rows = list(range(len(self.prompt)))
        if not self.has_images(rows):
            return None
        samples = [self.sample(i, None) for i in rows]
        return ImageBatch.of_samples(samples, max(self.prompt_lengths), [list(images) for images in self.sources])
