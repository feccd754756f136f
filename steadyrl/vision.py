"""Images in prompts: a vision-language model's per-sample image inputs, as they travel with the token ids.

A processor (``transformers.ProcessorMixin``) renders a conversational prompt with its images into token ids (the
image tokens expanded) and image tensors. Those come in two kinds, told apart by their shape:

- **token-aligned** ([P], one value per prompt token: Qwen's ``mm_token_type_ids``, Gemma3's ``token_type_ids``): kept
  aligned with the left-padded prompt ids; over the completion, 1 on image tokens (a tool reply's image) and 0
  elsewhere, as the processors set them;
- **image rows** ([R, ...], rows per image or per patch: ``pixel_values``, ``image_grid_thw``, ``image_sizes``): each
  sample's rows kept in order (its prompt's images, then those of the tool replies in its completion), all samples'
  rows concatenated, with each sample's row count.

``ImageBatch`` holds both for N samples, selects rows of samples like any [N, ...] tensor, and flattens to named
tensors for a checkpoint (safetensors: stored exactly). Shapes: N samples, P prompt columns, C completion columns.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass

import torch

ROWS, COUNTS, TOKENS = "rows.", "counts.", "tokens."


@dataclass
class ImageBatch:
    """The image inputs of N samples.

    Args:
        rows: name -> [R, ...]: every sample's image rows, sample after sample.
        counts: name -> [N] long: how many of those rows each sample has.
        tokens: name -> [N, P] long: per prompt token, aligned with the left-padded prompt ids (0 on padding).
        sources: each sample's images as the dataset gave them (PIL), for an engine that processes them itself
            (vLLM's ``multi_modal_data``); not stored in checkpoints (None after a resume: the tensors are).

    Example::

        images = ImageBatch.of_samples([processed_a, processed_b], width=prompt_ids.shape[1])
        inputs = images.model_inputs(prompt_width=P, completion_width=C)  # pixel_values, image_grid_thw, ...
    """

    rows: dict[str, torch.Tensor]
    counts: dict[str, torch.Tensor]
    tokens: dict[str, torch.Tensor]
    sources: list[list] | None = None

    @classmethod
    def of_samples(
        cls, samples: list[dict[str, torch.Tensor]], width: int, sources: list[list] | None = None
    ) -> ImageBatch:
        """One sample's inputs per entry (token-aligned ones [P_i] long, image rows [R_i, ...]), the token-aligned
        ones left-padded to ``width`` columns; ``sources``: each sample's images. A sample without an input another
        has (a prompt without images) has none of its rows and zeros for its token-aligned values."""
        first: dict[str, torch.Tensor] = {}
        for sample in samples:
            for name, value in sample.items():
                first.setdefault(name, value)
        token_names = [name for name in first if first[name].dim() == 1 and name in TOKEN_ALIGNED]
        rows, counts, tokens = {}, {}, {}
        for name, example in first.items():
            empty = example.new_zeros(0, *example.shape[1:])
            values = [sample.get(name, empty) for sample in samples]
            if name in token_names:
                padded = torch.zeros(len(values), width, dtype=values[0].dtype)
                for i, value in enumerate(values):
                    padded[i, width - len(value) :] = value
                tokens[name] = padded
            else:
                rows[name] = torch.cat(values)
                counts[name] = torch.tensor([len(value) for value in values], dtype=torch.long)
        return cls(rows, counts, tokens, sources)

    def has_images(self) -> bool:
        """Whether any sample has an image (a micro-batch of samples whose tool replies held none has not)."""
        return any(len(values) for values in self.rows.values())

    def __len__(self) -> int:
        first = next(iter(self.counts.values()), None)
        return len(first) if first is not None else len(next(iter(self.tokens.values())))

    def select(self, index: torch.Tensor | slice) -> ImageBatch:
        """The samples at ``index`` (an index tensor or a slice), in that order."""
        if isinstance(index, slice):
            index = torch.arange(len(self))[index]
        index = index.cpu().long()
        rows, counts = {}, {}
        for name, values in self.rows.items():
            count = self.counts[name].cpu()
            starts = count.cumsum(0) - count
            picked = [torch.arange(int(starts[i]), int(starts[i] + count[i])) for i in index.tolist()]
            taken = torch.cat(picked) if picked else torch.zeros(0, dtype=torch.long)
            rows[name], counts[name] = values[taken.to(values.device)], self.counts[name][index.to(count.device)]
        tokens = {name: values[index.to(values.device)] for name, values in self.tokens.items()}
        sources = None if self.sources is None else [self.sources[i] for i in index.tolist()]
        return ImageBatch(rows, counts, tokens, sources)

    def sample_keys(self) -> list[bytes]:
        """One digest per sample of its image inputs: equal for samples with the same images (a group's)."""
        digests = [hashlib.sha256() for _ in range(len(self))]
        for name, values in sorted(self.rows.items()):
            ends = self.counts[name].cpu().cumsum(0).tolist()
            flat = values.detach().cpu().contiguous()
            for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
                digests[i].update(name.encode() + flat[start:end].numpy().tobytes())
        return [digest.digest() for digest in digests]

    def to(self, device: torch.device | str) -> ImageBatch:
        move = lambda named: {name: value.to(device) for name, value in named.items()}  # noqa: E731
        return ImageBatch(move(self.rows), move(self.counts), move(self.tokens), self.sources)

    def fit_prompt(self, width: int) -> ImageBatch:
        """The token-aligned tensors cut or left-padded to ``width`` columns, as the prompt ids are trimmed."""
        tokens = {name: fit_left(value, width) for name, value in self.tokens.items()}
        return ImageBatch(self.rows, self.counts, tokens, self.sources)

    def model_inputs(
        self, prompt_width: int, completion_width: int, completion_images: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """The model's keyword arguments for prompt + completion columns: the image rows as they are, the
        token-aligned tensors fitted to the prompt and, over the completion, ``completion_images`` ([N, C]: 1 on an
        image token of a tool reply) or zero."""
        inputs = dict(self.rows)
        for name, value in self.tokens.items():
            prompt = fit_left(value, prompt_width)
            completion = prompt.new_zeros(len(prompt), completion_width)
            if completion_images is not None:
                completion = completion_images.to(completion)
            inputs[name] = torch.cat([prompt, completion], dim=1)
        return inputs

    def samples(self, lengths: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each sample's inputs as ``of_samples`` takes them: image rows [R_i, ...], token-aligned ones cut to the
        sample's prompt of ``lengths[i]`` tokens."""
        starts = {name: (count.cpu().cumsum(0) - count.cpu()).tolist() for name, count in self.counts.items()}
        out = []
        for i, length in enumerate(lengths):
            sample = {name: self.tokens[name][i, self.tokens[name].shape[1] - length :] for name in self.tokens}
            for name, values in self.rows.items():
                start = starts[name][i]
                sample[name] = values[start : start + int(self.counts[name][i])]
            out.append(sample)
        return out

    def flat(self) -> dict[str, torch.Tensor]:
        """Named tensors (a checkpoint's), read back by ``from_flat``."""
        named = {ROWS + k: v for k, v in self.rows.items()}
        named.update({COUNTS + k: v for k, v in self.counts.items()})
        return {**named, **{TOKENS + k: v for k, v in self.tokens.items()}}

    @classmethod
    def from_flat(cls, named: dict[str, torch.Tensor]) -> ImageBatch:
        part = lambda prefix: {k[len(prefix) :]: v for k, v in named.items() if k.startswith(prefix)}  # noqa: E731
        return cls(part(ROWS), part(COUNTS), part(TOKENS))

    @classmethod
    def concatenate(cls, parts: list[ImageBatch]) -> ImageBatch:
        """The samples of ``parts`` in order, the token-aligned tensors left-padded to the widest."""
        first = parts[0]
        rows = {name: torch.cat([part.rows[name] for part in parts]) for name in first.rows}
        counts = {name: torch.cat([part.counts[name] for part in parts]) for name in first.counts}
        tokens = {}
        for name in first.tokens:
            width = max(part.tokens[name].shape[1] for part in parts)
            tokens[name] = torch.cat([fit_left(part.tokens[name], width) for part in parts])
        known = all(part.sources is not None for part in parts)
        sources = [images for part in parts for images in part.sources] if known else None
        return cls(rows, counts, tokens, sources)


def fit_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` [N, W] cut to its last ``width`` columns, or left-padded with zeros to them."""
    if tensor.shape[1] >= width:
        return tensor[:, tensor.shape[1] - width :]
    return torch.cat([tensor.new_zeros(len(tensor), width - tensor.shape[1]), tensor], dim=1)


def model_image_tokens(model) -> list[int]:
    """The ids ``model``'s config gives the tokens that stand for image features."""
    config = getattr(getattr(model, "module", model), "config", None)
    ids = [getattr(config, name, None) for name in ("image_token_id", "image_token_index", "video_token_id")]
    return sorted({i for i in ids if isinstance(i, int) and i >= 0})


def image_token_mask(model, ids: torch.Tensor) -> torch.Tensor:
    """[N, C] long: 1 where ``ids`` is one of ``model``'s image tokens (a tool reply's image in a completion)."""
    return torch.isin(ids, torch.tensor(model_image_tokens(model), dtype=ids.dtype, device=ids.device)).long()


def computes_own_positions(model) -> bool:
    """Positions derived from the images (Qwen's mrope, ``get_rope_index``): the forward computes them itself from
    the attention mask, so none are passed."""
    model = getattr(model, "module", model)  # a DDP / DeepSpeed wrapper
    inner = getattr(model, "model", model)
    return any(hasattr(m, "get_rope_index") for m in (model, inner))


def image_positions(model, prompt_ids: torch.Tensor, images: ImageBatch) -> torch.Tensor | None:
    """[3, P]: the positions a model whose positions come from the images (Qwen's mrope, ``get_rope_index``) gives
    one prompt [P] with its image inputs (``images``: that one sample's, fitted to the prompt); None for others."""
    model = getattr(model, "module", model)
    owner = next((m for m in (getattr(model, "model", None), model) if hasattr(m, "get_rope_index")), None)
    if owner is None:
        return None
    accepted = inspect.signature(owner.get_rope_index).parameters
    inputs = images.model_inputs(len(prompt_ids), 0)
    kwargs = {name: value for name, value in inputs.items() if name in accepted}
    ids = prompt_ids[None]
    positions, _ = owner.get_rope_index(ids, attention_mask=torch.ones_like(ids), **kwargs)
    return positions[:, 0]


# per-prompt-token inputs of the families steadyrl trains (TRL's list): Qwen's, Gemma3's
TOKEN_ALIGNED = ("mm_token_type_ids", "token_type_ids")
