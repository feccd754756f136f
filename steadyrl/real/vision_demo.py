"""A small vision-language model built here, since no pretrained one can be installed: SmolLM2-135M-Instruct as the
language model, a small SigLIP vision tower and LLaVA's two-layer projector, assembled as a
``LlavaForConditionalGeneration`` with a ``LlavaProcessor`` (a PIL image processor: no torchvision). 135.5M
parameters: the language model 134.5M, the tower 0.6M, the projector 0.4M.

Built in three steps, deterministically (``build``):

1. ``assemble``: the language model's weights copied in, its tokenizer given an ``<image>`` token (embeddings
   resized) and a chat template that places images; the tower and projector randomly initialised.
2. ``pretrain_vision``: the tower alone learns to classify what an image of a shape shows (its colour, its kind and
   its side), a stand-in for a pretrained image encoder, which no package ships.
3. ``align``: LLaVA's first stage, the projector trained alone (the language model and the tower frozen) to caption
   the shapes ("A red circle.", steadyrl/real/shapes.py). The captions never say where the shape is.

``vision_demo_path()`` builds it once into the cache (about 1 minute on 2 idle cores, 2 CPU minutes) and returns its
directory; ``load_vision_demo`` loads the model and its processor. Asked on which side the shape is, the aligned model
answers right about one time in five: bench/vision_demo.py teaches it with GRPO.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

from ..cache import build_cached
from .shapes import CAPTION_PROMPT, COLOURS, IMAGE_SIZE, SHAPES, SIDES, caption, random_shape
from .smollm2 import smollm2_path

VISION_DEMO_VERSION = 4
IMAGE_TOKEN = "<image>"
# SigLIP's vision transformer at a small size: 48 px images in 24 px patches, 4 image tokens, no pooling head. SigLIP
# rather than CLIP: its position embeddings start at 1/sqrt(width) (CLIP's at 0.02, far below its patch features),
# so a tower this small learns where a shape is as quickly as what it is (CLIP's, here: not in 500 steps).
VISION_CONFIG = dict(
    model_type="siglip_vision_model",
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=IMAGE_SIZE,
    patch_size=24,
    vision_use_head=False,
)
PRETRAINING = dict(steps=200, batch_size=32, learning_rate=1e-3, seed=0)
ALIGNMENT = dict(steps=60, batch_size=16, learning_rate=2e-3, seed=0)
# SmolLM2's own template (its default system message included), with image blocks rendered as the image token
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for block in message['content'] %}"
    "{% if block['type'] == 'image' %}{{ '<image>\\n' }}{% elif block['type'] == 'text' %}{{ block['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer(language_model: str):
    """The language model's tokenizer with the image token added and the image-placing chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(language_model)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def vision_processor(tokenizer, vision_config: dict = VISION_CONFIG):
    """A ``LlavaProcessor``: SigLIP's normalisation at the tower's image size (PIL, no torchvision) and
    ``tokenizer``."""
    from transformers import LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    size = vision_config["image_size"]
    images = LlavaImageProcessorPil(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return LlavaProcessor(
        images,
        tokenizer,
        patch_size=vision_config["patch_size"],
        vision_feature_select_strategy="full",  # every patch: SigLIP has no class token
        chat_template=tokenizer.chat_template,
        image_token=IMAGE_TOKEN,
    )


def assemble(language_model: str, tokenizer, vision_config: dict = VISION_CONFIG, seed: int = 0):
    """A ``LlavaForConditionalGeneration`` whose language model is ``language_model``'s (a Llama checkpoint), its
    embeddings resized for ``tokenizer``; the vision tower and projector initialised from ``seed``. Float32."""
    import torch
    from transformers import AutoModelForCausalLM, LlavaConfig, LlavaForConditionalGeneration

    text = AutoModelForCausalLM.from_pretrained(language_model, dtype=torch.float32)
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # the image token's embedding is drawn around the others' mean
        text.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    patches = (vision_config["image_size"] // vision_config["patch_size"]) ** 2
    config = LlavaConfig(
        text_config=text.config.to_dict(),
        vision_config=dict(vision_config),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=patches,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        tie_word_embeddings=text.config.tie_word_embeddings,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    model.generation_config = text.generation_config
    return model.to(torch.float32)


def language_model_parameters(model) -> list:
    return list(model.model.language_model.parameters()) + list(model.lm_head.parameters())


def caption_batch(processor, rng: random.Random, batch_size: int):
    """Random shapes and their captions, rendered for training: the conversation's fixed prefix (the system message
    and the user turn's start: the same ids for every sample) and, per sample, the rest (the image, the question,
    the caption, the end of the turn) right-padded, with labels on the caption and the end of the turn only."""
    import torch

    shapes = [random_shape(rng) for _ in range(batch_size)]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": CAPTION_PROMPT}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prefix, rest = prompt[: prompt.index(IMAGE_TOKEN)], prompt[prompt.index(IMAGE_TOKEN) :]
    texts = [rest + caption(s["colour"], s["shape"]) + processor.tokenizer.eos_token for s in shapes]
    inputs = processor(text=texts, images=[s["image"] for s in shapes], padding=True, return_tensors="pt")
    question_length = len(processor(text=[rest], images=[shapes[0]["image"]])["input_ids"][0])
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    labels[:, :question_length] = -100
    prefix_ids = torch.tensor([processor.tokenizer(prefix, add_special_tokens=False)["input_ids"]])
    return prefix_ids, {**inputs, "labels": labels}, shapes


def caption_loss(model, prefix_ids, batch):
    """The captions' mean token cross-entropy. The fixed prefix runs once, without gradients (it depends on no trained
    weight), and the LM head runs only where there is a label."""
    import torch

    size = len(batch["input_ids"])
    with torch.no_grad():
        cache = model.model.language_model(input_ids=prefix_ids, use_cache=True).past_key_values
    cache.batch_repeat_interleave(size)
    mask = torch.cat([torch.ones(size, prefix_ids.shape[1], dtype=torch.long), batch["attention_mask"]], dim=1)
    hidden = model.model(
        input_ids=batch["input_ids"], pixel_values=batch["pixel_values"], attention_mask=mask, past_key_values=cache
    ).last_hidden_state
    labels = batch["labels"][:, 1:]
    scored = labels != -100
    logits = model.lm_head(hidden[:, :-1][scored])
    return torch.nn.functional.cross_entropy(logits, labels[scored])


def image_features(model, pixel_values):
    """The vision tower's patch features as LLaVA selects them (the last layer's, every patch), pooled."""
    states = model.model.vision_tower(pixel_values, output_hidden_states=True).hidden_states
    return states[model.config.vision_feature_layer].mean(dim=1)


def pretrain_vision(model, processor, steps: int, batch_size: int, learning_rate: float, seed: int, log=print):
    """The vision tower trained alone to classify what its image shows: the shape's colour, its kind and its side of
    the image (linear heads on the pooled patch features, dropped afterwards). A stand-in for a pretrained image
    encoder, which no package ships: its features carry what is drawn and where, as a real encoder's do. Seconds:
    the tower is small and the language model idle."""
    import torch

    labels = {"colour": list(COLOURS), "shape": list(SHAPES), "side": list(SIDES)}
    rng, width = random.Random(seed), model.config.vision_config.hidden_size
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        heads = torch.nn.ModuleDict({name: torch.nn.Linear(width, len(values)) for name, values in labels.items()})
        tower = list(model.model.vision_tower.parameters())
        optimizer = torch.optim.AdamW(tower + list(heads.parameters()), lr=learning_rate, weight_decay=0.0)
        for step in range(steps):
            shapes = [random_shape(rng, rng.choice(SIDES)) for _ in range(batch_size)]
            pixels = processor.image_processor([s["image"] for s in shapes], return_tensors="pt")["pixel_values"]
            features = image_features(model, pixels)
            logits = {name: heads[name](features) for name in labels}
            targets = {name: torch.tensor([values.index(s[name]) for s in shapes]) for name, values in labels.items()}
            loss = sum(torch.nn.functional.cross_entropy(logits[name], targets[name]) for name in labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 50 == 0 or step == steps - 1:
                right = {name: (logits[name].argmax(-1) == targets[name]).float().mean().item() for name in labels}
                shares = ", ".join(f"{name} {share:.0%}" for name, share in right.items())
                log(f"vision pretraining step {step + 1}/{steps}: classification loss {loss.item():.3f} ({shares})")


def align(model, processor, steps: int, batch_size: int, learning_rate: float, seed: int, log=print) -> list[float]:
    """The supervised alignment stage, as LLaVA's first stage: the projector trained alone (AdamW, constant learning
    rate) to caption random shapes, the language model and the vision tower frozen. Returns each step's loss."""
    import torch

    trained = list(model.model.multi_modal_projector.parameters())
    frozen = [p for p in model.parameters() if all(p is not q for q in trained)]
    for param in frozen:
        param.requires_grad_(False)
    rng, losses = random.Random(seed), []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(trained, lr=learning_rate, weight_decay=0.0)
        model.train()
        for step in range(steps):
            prefix_ids, batch, _ = caption_batch(processor, rng, batch_size)
            loss = caption_loss(model, prefix_ids, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if step % 10 == 0 or step == steps - 1:
                log(f"alignment step {step + 1}/{steps}: caption loss {loss.item():.3f}")
    model.eval()
    for param in frozen:
        param.requires_grad_(True)
    return losses


def greedy_replies(model, processor, prompts: list, images: list, max_new_tokens: int, batch_size: int = 32):
    """The model's greedy replies to conversational ``prompts`` (a user message each), each with its image."""
    import torch

    side, was_training = processor.tokenizer.padding_side, model.training
    processor.tokenizer.padding_side = "left"
    model.eval()
    replies = []
    try:
        for i in range(0, len(prompts), batch_size):
            texts = [
                processor.apply_chat_template(with_image(prompt), add_generation_prompt=True, tokenize=False)
                for prompt in prompts[i : i + batch_size]
            ]
            inputs = processor(text=texts, images=images[i : i + batch_size], padding=True, return_tensors="pt")
            with torch.no_grad():
                output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
            new = output[:, inputs["input_ids"].shape[1] :]
            replies += processor.tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        processor.tokenizer.padding_side = side
        model.train(was_training)
    return replies


def with_image(prompt: list[dict]) -> list[dict]:
    """A one-message conversation with an image block before its text, as the trainers place an ``image`` column."""
    (message,) = prompt
    return [{**message, "content": [{"type": "image"}, {"type": "text", "text": message["content"]}]}]


def caption_accuracy(model, processor, size: int = 64, seed: int = 1) -> tuple[float, list[str]]:
    """The share of ``size`` held-out shapes whose greedy caption names both their colour and their shape."""
    rng = random.Random(seed)
    shapes = [random_shape(rng) for _ in range(size)]
    prompt = [{"role": "user", "content": CAPTION_PROMPT}]
    replies = greedy_replies(model, processor, [prompt] * size, [s["image"] for s in shapes], max_new_tokens=8)
    right = [s["colour"] in r.lower() and s["shape"] in r.lower() for s, r in zip(shapes, replies)]
    return sum(right) / size, replies


def build(
    directory: Path,
    language_model: str,
    pretraining: dict = PRETRAINING,
    alignment: dict = ALIGNMENT,
    vision_config: dict = VISION_CONFIG,
    held_out: int = 64,
    log=print,
) -> None:
    """Assemble the model, pretrain its vision tower, align it, and save it with its processor into ``directory``
    (``alignment.json``: the settings and the greedy caption accuracy on ``held_out`` images)."""
    tokenizer = build_tokenizer(language_model)
    processor = vision_processor(tokenizer, vision_config)
    model = assemble(language_model, tokenizer, vision_config)
    wall, cpu = time.time(), time.process_time()
    pretrain_vision(model, processor, log=log, **pretraining)
    losses = align(model, processor, log=log, **alignment)
    wall, cpu = time.time() - wall, time.process_time() - cpu
    accuracy, _ = caption_accuracy(model, processor, held_out)
    log(f"aligned in {wall / 60:.1f} min ({cpu / 60:.1f} CPU min): greedy captions name colour and shape on")
    log(f"{accuracy:.0%} of {held_out} held-out images")
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    record = {
        "pretraining": pretraining,
        "alignment": alignment,
        "final_caption_loss": losses[-1] if losses else None,
        "caption_accuracy": accuracy,
        "held_out": held_out,
        "minutes": round(wall / 60, 2),
        "cpu_minutes": round(cpu / 60, 2),
    }
    (directory / "alignment.json").write_text(json.dumps(record, indent=1))


def load_vision_demo(directory: str):
    """The model (float32) and its processor, saved by ``build``."""
    import torch
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(directory, dtype=torch.float32)
    vision = model.config.vision_config
    sizes = dict(image_size=vision.image_size, patch_size=vision.patch_size)
    return model, vision_processor(AutoTokenizer.from_pretrained(directory), sizes)


def vision_demo_path() -> str:
    """The directory of the aligned vision-language model (built on first use, about 1 minute on 2 cores, then cached
    under ``$STEADYRL_CACHE``); load its processor with ``AutoProcessor`` or ``vision_processor``."""
    language_model = smollm2_path()
    spec = [VISION_DEMO_VERSION, VISION_CONFIG, PRETRAINING, ALIGNMENT, CHAT_TEMPLATE, Path(language_model).name]
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return build_cached(f"vision-demo-smollm2-{fingerprint}", lambda d: build(d, language_model))
