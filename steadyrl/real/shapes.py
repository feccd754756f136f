"""Synthetic images of coloured shapes for the vision-language demo (steadyrl/real/vision_demo.py): captions to align
the vision encoder with the language model, and a question about where the shape is, for GRPO.

Every image is a grey square with one shape (a square, a circle or a triangle, in one of four colours) at a random
place. The captions name the colour and the shape, never the place; the question asks for the place (``left`` or
``right``), which the aligned model has never been taught to say.
"""

from __future__ import annotations

import random
import re

IMAGE_SIZE = 48  # pixels a side
SHAPE_SIZE = 18  # the shape's bounding box, pixels a side
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 230), "yellow": (235, 210, 40)}
SHAPES = ("square", "circle", "triangle")
SIDES = ("left", "right")
CAPTION_PROMPT = "Describe the image."
# the two sides named in either order: a language model favours the option named first, and a question that always
# named "left" first would have GRPO sample "right" too rarely to learn from
POSITION_PROMPT = "Is the shape on the {0} or on the {1} of the image? Answer with one word: {0} or {1}."
_WORD = re.compile(r"[a-z]+")


def shape_image(colour: str, shape: str, x: int, y: int, size: int = IMAGE_SIZE):
    """A grey ``size`` x ``size`` image with ``shape`` in ``colour``, its bounding box's corner at (x, y)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (128, 128, 128))
    draw, fill, end = ImageDraw.Draw(image), COLOURS[colour], (x + SHAPE_SIZE - 1, y + SHAPE_SIZE - 1)
    if shape == "square":
        draw.rectangle([x, y, *end], fill=fill)
    elif shape == "circle":
        draw.ellipse([x, y, *end], fill=fill)
    else:
        draw.polygon([(x + SHAPE_SIZE // 2, y), (x, end[1]), (end[0], end[1])], fill=fill)
    return image


def random_shape(rng: random.Random, side: str | None = None) -> dict:
    """A random shape's description: colour, shape, its side of the image and the image. With ``side``, the whole
    shape lies in that half; otherwise anywhere."""
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    half = IMAGE_SIZE // 2
    if side is None:
        x = rng.randint(0, IMAGE_SIZE - SHAPE_SIZE)
    else:
        x = rng.randint(0, half - SHAPE_SIZE) + (half if side == "right" else 0)
    y = rng.randint(0, IMAGE_SIZE - SHAPE_SIZE)
    where = "left" if x + SHAPE_SIZE / 2 < half else "right"
    return dict(colour=colour, shape=shape, side=where, image=shape_image(colour, shape, x, y))


def caption(colour: str, shape: str) -> str:
    return f"A {colour} {shape}."


def position_dataset(size: int, seed: int):
    """``size`` rows ``{"prompt": [user message], "image": PIL image, "side": "left" | "right"}`` (a
    ``datasets.Dataset``), the sides balanced and shuffled, the question naming them in a random order; each seed
    draws different images."""
    from datasets import Dataset

    rng = random.Random(seed)
    sides = [SIDES[i % 2] for i in range(size)]
    rng.shuffle(sides)
    shapes = [random_shape(rng, side) for side in sides]
    orders = [rng.sample(SIDES, 2) for _ in shapes]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": POSITION_PROMPT.format(*order)}] for order in orders],
            "image": [s["image"] for s in shapes],
            "side": sides,
        }
    )


def sides_named(text: str) -> set[str]:
    return {word for word in _WORD.findall(text.lower()) if word in SIDES}


def reply_texts(completions: list) -> list[str]:
    """Each completion's text: a string, or a conversational completion's last message's content."""
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def correct_side(completions: list, side: list[str], **kwargs) -> list[float]:
    """1.0 for an answer that names the shape's side and not the other one, else 0.0 (the accuracy): echoing the
    question's "left or right" scores nothing."""
    return [float(sides_named(text) == {answer}) for text, answer in zip(reply_texts(completions), side)]


def one_word_answer(completions: list, **kwargs) -> list[float]:
    """1.0 for an answer that is one of the words ``left`` / ``right`` and nothing else (the format asked for)."""
    return [
        float(re.fullmatch(r"\s*(left|right)\.?\s*", text.lower()) is not None) for text in reply_texts(completions)
    ]
