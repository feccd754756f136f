"""The embedded vision fixture: tiny vision-language stand-ins (Qwen2.5-VL and LLaVA-Next architectures, built
offline and randomly initialised) with processors, and a dataset of coloured squares.

The processors are the architectures' own classes without their video processor: transformers builds a video
processor only with torchvision, which this project does not install; images need none. The character tokenizer is
the chat fixture's with the families' image tokens added. The task: name the colour of the square in the image;
``colour_reward`` is 1 for an answer that starts with it.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from ..cache import build_cached
from .chat import MODEL_CONFIG as TEXT_CONFIG
from .chat import build_chat_tokenizer

VISION_VERSION = 1
QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
LLAVA_TOKENS = ["<image>"]
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 210, 40)}
IMAGE_SIZE = 56  # pixels a side: 4 x 4 patches of 14 for Qwen's processor, merged 2 x 2 into 4 image tokens
# a content block {"type": "image"} renders as the family's image placeholder; text blocks as their text
_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for block in message['content'] %}"
    "{% if block['type'] == 'image' %}{{ 'IMAGE' }}{% elif block['type'] == 'text' %}{{ block['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEMPLATES = {
    "qwen2_5_vl": _TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>"),
    "llava_next": _TEMPLATE.replace("IMAGE", "<image>"),
}
VISION_CONFIG = {
    "qwen2_5_vl": dict(
        depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128, fullatt_block_indexes=[1]
    ),
    "llava_next": dict(
        model_type="clip_vision_model",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    ),
}
FAMILIES = tuple(TEMPLATES)


def build_vision_tokenizer(family: str = "qwen2_5_vl"):
    """The chat fixture's character tokenizer with ``family``'s image tokens and a chat template for images."""
    tokenizer = build_chat_tokenizer()
    tokens = QWEN_TOKENS if family == "qwen2_5_vl" else LLAVA_TOKENS
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    tokenizer.chat_template = TEMPLATES[family]
    return tokenizer


def build_processor(family: str = "qwen2_5_vl", tokenizer=None):
    """``family``'s processor class with its image processor (PIL), no video processor."""
    tokenizer = tokenizer or build_vision_tokenizer(family)
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLProcessor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        from ..generation.vllm_images import image_only_processor

        pixels = IMAGE_SIZE * IMAGE_SIZE
        images = Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels)
        return image_only_processor(Qwen2_5_VLProcessor)(images, tokenizer, chat_template=tokenizer.chat_template)
    from transformers import LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    size = VISION_CONFIG["llava_next"]["image_size"]
    images = LlavaNextImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}, image_grid_pinpoints=[[size, size]]
    )
    return LlavaNextProcessor(
        images,
        tokenizer,
        patch_size=VISION_CONFIG["llava_next"]["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's class token, which "default" drops
        chat_template=tokenizer.chat_template,
        image_token="<image>",
    )


def build_vision_model(tokenizer, family: str = "qwen2_5_vl", seed: int = 0):
    """A randomly initialised ``family`` model sized for the tokenizer (about 0.4 M parameters), float32."""
    import torch
    from transformers import GenerationConfig

    special = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    text = {**TEXT_CONFIG, "vocab_size": len(tokenizer), "bos_token_id": None, **special}
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 10000.0}
        config = Qwen2_5_VLConfig(
            text_config=text,
            vision_config=VISION_CONFIG[family],
            image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
            video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
            vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
            tie_word_embeddings=True,
            **special,
        )
        model_class = Qwen2_5_VLForConditionalGeneration
    else:
        from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

        config = LlavaNextConfig(
            text_config={**text, "model_type": "qwen2"},
            vision_config=VISION_CONFIG[family],
            image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
            image_grid_pinpoints=[[28, 28]],
            vision_feature_layer=-1,
            tie_word_embeddings=True,
        )
        model_class = LlavaNextForConditionalGeneration
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config = GenerationConfig(**special)
    return model


def vision_model_path(family: str = "qwen2_5_vl", seed: int = 0) -> str:
    """Build ``family``'s stand-in (initialised from ``seed``: another seed makes a teacher for distillation) and
    tokenizer once and cache them; return the directory (the processor is ``build_processor(family)``)."""

    def build(directory: Path) -> None:
        tokenizer = build_vision_tokenizer(family)
        build_vision_model(tokenizer, family, seed).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    spec = [VISION_VERSION, family, TEMPLATES[family], VISION_CONFIG[family], TEXT_CONFIG, seed]
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return build_cached(f"vision-{family}-{fingerprint}", build)


def square_image(colour: str, rng: random.Random, size: int = IMAGE_SIZE):
    """A grey ``size`` x ``size`` image with a square of ``colour`` at a random place."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (128, 128, 128))
    side = size // 2
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    ImageDraw.Draw(image).rectangle([x, y, x + side - 1, y + side - 1], fill=COLOURS[colour])
    return image


def colour_dataset(num_prompts: int = 32, seed: int = 0, size: int = IMAGE_SIZE):
    """Rows ``{"prompt": [user message], "image": <a square>, "colour": name}`` as a ``datasets.Dataset``."""
    from datasets import Dataset

    rng = random.Random(seed)
    colours = [rng.choice(list(COLOURS)) for _ in range(num_prompts)]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": "What colour is the square?"}] for _ in colours],
            "image": [square_image(colour, rng, size) for colour in colours],
            "colour": colours,
        }
    )


def _texts(completions: list) -> list[str]:
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def colour_reward(completions: list, colour: list[str], **kwargs) -> list[float]:
    """1.0 for an answer that starts with the square's colour, else 0.0 (the accuracy)."""
    return [float(text.strip().lower().startswith(name)) for text, name in zip(_texts(completions), colour)]


def colour_letters_reward(completions: list, colour: list[str], **kwargs) -> list[float]:
    """The fraction of the answer's first 6 characters that are letters of the square's colour: a dense reward a
    random model already scores above 0 on, and that depends on the image."""
    return [sum(ch in name for ch in text[:6]) / 6 for text, name in zip(_texts(completions), colour)]


def add(a: int, b: int) -> list:
    """Add two integers, and show the sum as a picture (the tool fixture's ``add``, whose call the model knows).

    Args:
        a: The first number.
        b: The second number.
    """
    colour = list(COLOURS)[(a + b) % len(COLOURS)]  # a tool reply with an image, as TRL's multimodal tools give
    image = square_image(colour, random.Random(a * 1000 + b))
    return [{"type": "image", "image": image}, {"type": "text", "text": str(a + b)}]


def vision_tool_tokenizer():
    """The tool fixture's tokenizer (its call format, ``response_template``) with Qwen's image tokens, and its chat
    template extended to render image blocks (a tool reply's picture) as Qwen2.5-VL's placeholder."""
    from .tools import TOOL_CHAT_TEMPLATE, tool_tokenizer

    tokenizer = tool_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    blocks = (
        "{% if message.content is string %}{{ message.content }}{% else %}{% for block in message.content %}"
        "{% if block.type == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
        "{% elif block.type == 'text' %}{{ block.text }}{% endif %}{% endfor %}{% endif %}"
    )
    plain = "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    assert plain in TOOL_CHAT_TEMPLATE
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE.replace(
        plain, "{{ '<|im_start|>' + message.role + '\\n' }}" + blocks + "{{ '<|im_end|>\\n' }}"
    )
    return tokenizer


def vision_tool_model_path() -> str:
    """A Qwen2.5-VL stand-in that calls tools: the language model is the tool fixture's (taught the calculator's call
    format), the vision tower and the image tokens' embeddings random; a tool's reply may hold a picture. Built once
    and cached; the processor is ``build_processor("qwen2_5_vl", vision_tool_tokenizer())``."""
    from .tools import tool_model_path

    def build(directory: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        tokenizer = vision_tool_tokenizer()
        model = build_vision_model(tokenizer, "qwen2_5_vl")
        text = AutoModelForCausalLM.from_pretrained(tool_model_path(), dtype=torch.float32)
        language = model.model.language_model
        with torch.no_grad():
            vocab = text.model.embed_tokens.weight.shape[0]
            language.embed_tokens.weight[:vocab] = text.model.embed_tokens.weight
            own = {k: v for k, v in text.model.state_dict().items() if not k.startswith("embed_tokens")}
            missing, unexpected = language.load_state_dict(own, strict=False)
            if unexpected or set(missing) != {"embed_tokens.weight"}:
                raise RuntimeError(f"the tool model's weights do not fit: {missing}, {unexpected}")
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    spec = [VISION_VERSION, "tools", VISION_CONFIG["qwen2_5_vl"], TEXT_CONFIG, Path(tool_model_path()).name]
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return build_cached(f"vision-tools-{fingerprint}", build)
