"""Packed against padded passes with images, for every vision-language family TRL tests (its tiny stand-ins,
tests/integration/trl_suite/vision_standins.py): the log-probs of the completions of 2 prompts (1 image each) x 2
completions, the largest difference on the completion tokens, whether steadyrl packs the family (its once-per-model
check, ``images_packing_fallback``) and how many images its vision tower encodes in each pass.

    python bench/vision_packing_families.py [--families gemma3,qwen2_5_vl,...]

Builds the stand-ins on first use (tests/integration/trl_suite/standins.py: Qwen's tokenizer from the dashscope wheel,
SmolLM2's from the real-model fixture), in the steadyrl cache.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the stand-ins are local: no request may leave for the Hub
ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "tests" / "integration" / "trl_suite"
sys.path.insert(0, str(SUITE))


def stand_in_hub() -> Path:
    from standins import build

    cache = Path(os.environ.get("STEADYRL_CACHE", Path.home() / ".cache" / "steadyrl")) / "trl-suite-standins"
    return build(cache) / "hub"


def compare(repo_id: str, family: str, hub: Path) -> dict:
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from steadyrl.data.images import encode_prompts, image_token_ids, with_images
    from steadyrl.ops import pad_prompts_and_completions
    from steadyrl.ops.logprobs import completion_logprobs, images_packing_fallback
    from steadyrl.vision import ImageBatch

    where = dict(cache_dir=hub, local_files_only=True)
    processor = AutoProcessor.from_pretrained(repo_id, **where)
    model = AutoModelForImageTextToText.from_pretrained(repo_id, dtype=torch.float32, **where).eval()
    rng = random.Random(0)
    images = [Image.new("RGB", (rng.randint(32, 64), rng.randint(32, 64)), (rng.randrange(256), 40, 90)) for _ in "ab"]
    questions = ["What is in the image?", "Describe the colour, please."]
    prompts = [with_images([{"role": "user", "content": q}], [image]) for q, image in zip(questions, images)]
    rows = [prompts[0], prompts[0], prompts[1], prompts[1]]  # 2 groups of 2 completions
    ids, inputs = encode_prompts(rows, processor, None)
    banned = set(image_token_ids(processor, model)) | set(processor.tokenizer.all_special_ids)
    vocabulary = [t for t in range(min(len(processor.tokenizer), 1000)) if t not in banned]
    completions = [[rng.choice(vocabulary) for _ in range(n)] for n in (5, 3, 4, 6)]
    tokens = pad_prompts_and_completions(ids, completions, processor.tokenizer.pad_token_id, "cpu")
    batch = ImageBatch.of_samples(inputs, max(map(len, ids)))
    reason = images_packing_fallback(model, tuple(tokens.values()), batch, None)
    encoded = []
    tower = next(m for name in ("visual", "vision_tower", "vision_model") if (m := getattr(model.model, name, None)))

    def count(module, args, kwargs, output):
        encoded.append((args[0] if args else kwargs.get("pixel_values", kwargs.get("hidden_states"))).shape[0])

    handle = tower.register_forward_hook(count, with_kwargs=True)
    with torch.no_grad():
        padded, _ = completion_logprobs(model, *tokens.values(), images=batch)
        packed, _ = completion_logprobs(model, *tokens.values(), images=batch, packing=True)
    handle.remove()
    mask = tokens["completion_mask"]
    return {
        "family": family,
        "packed": "yes" if not reason else f"padded: {reason}",
        "max |packed - padded|": f"{((packed - padded) * mask).abs().max().item():.1e}",
        "tower rows padded / packed": f"{encoded[0]} / {encoded[-1]}",
    }


def main() -> None:
    from vision_standins import VISION_MODELS, register

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", help="comma-separated (default: every family but the refused idefics2)")
    opts = parser.parse_args()
    wanted = opts.families.split(",") if opts.families else [f for f in VISION_MODELS.values() if f != "idefics2"]
    hub = stand_in_hub()
    register()
    rows = [compare(repo, family, hub) for repo, family in VISION_MODELS.items() if family in wanted]
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row[c] for c in columns) + " |")


if __name__ == "__main__":
    main()
