"""Vision-language GRPO, steadyrl vs TRL 1.16, on a Qwen2.5-VL stand-in with 448x448 images, interleaved in one run.

    python bench/vision_vs_trl.py [--models standin,standin-large] [--rounds standin=3,standin-large=3] ...

The machinery is bench/vs_trl.py's ``grpo-hf`` row (one worker process per library, rounds taking turns, medians
after warm-up, wall and CPU time per optimizer step, peak RSS via ``ru_maxrss``, the batch hierarchy mapped as in its
docstring), with three workers: steadyrl (``packing=True``: a group's prompt and image encoded once per pass), steadyrl
with ``packing=False`` (each completion's image encoded again in every pass, as TRL does) and TRL's ``GRPOTrainer``.
What changes here is the task, installed in each worker before vs_trl's worker runs:

- the model: ``standin`` is steadyrl.toy.vision's Qwen2.5-VL stand-in (language model hidden 128, 2 layers; vision
  tower hidden 64, depth 2); ``standin-large`` the same architecture, classes and tokenizer at sizes whose vision
  tower costs about what the language model costs per sequence, as in Qwen2.5-VL-3B with a 448x448 image
  (``LARGE`` below: language model hidden 512, 4 layers; tower hidden 256, depth 4; ~17M parameters);
- the processor: steadyrl.toy.vision's (PIL image processor, no torchvision) with ``min_pixels = max_pixels =
  448 * 448``, so each image is 32 x 32 = 1,024 patches, merged 2 x 2 into 256 image tokens (prompts of 303 tokens);
- the data: ``colour_dataset(size=448)`` (a coloured square on grey; an ``image`` column, conversational prompts),
  rewarded by ``colour_letters_reward``; both libraries are given the processor as ``processing_class``.

The vision tower (``Qwen2_5_VisionTransformerPretrainedModel``) is instrumented the same way in every worker: its
forward calls, the images they encode, their CPU seconds (``time.process_time``: each worker runs one thread, and the
machine is shared), and the CPU seconds of its backward (from the gradient reaching its output to the gradient of its
patch embedding being accumulated).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_shapes  # noqa: E402
import vs_trl  # noqa: E402

IMAGE_SIDE = 448  # pixels: 32 x 32 patches of 14, 256 image tokens after the 2 x 2 merge
NUM_PROMPTS = 64
LIBRARIES = ("steadyrl", "steadyrl-padded", "trl")
LARGE = dict(  # the larger stand-in: the tower's cost per image about the language model's per 303-token prompt
    text=dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    ),
    mrope_section=[8, 12, 12],  # head_dim 64 / 2
    vision=dict(
        depth=4, hidden_size=256, intermediate_size=640, num_heads=4, out_hidden_size=512, fullatt_block_indexes=[3]
    ),
)
TOWER = {"tower_calls": 0, "tower_images": 0, "tower_forward_s": 0.0, "tower_backward_s": 0.0}


# ---- the task: model, processor, data ---------------------------------------------------------------------


def large_standin_path() -> str:
    """steadyrl.toy.vision's Qwen2.5-VL stand-in at ``LARGE``'s sizes, built once and cached."""
    import hashlib
    import json

    import torch
    from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from steadyrl.cache import build_cached
    from steadyrl.toy.vision import build_vision_tokenizer

    def build(directory: Path) -> None:
        tok = build_vision_tokenizer("qwen2_5_vl")
        special = dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        rope = {"rope_type": "default", "mrope_section": LARGE["mrope_section"], "rope_theta": 10000.0}
        text = {**LARGE["text"], "vocab_size": len(tok), "bos_token_id": None, "rope_parameters": rope, **special}
        config = Qwen2_5_VLConfig(
            text_config=text,
            vision_config=LARGE["vision"],
            image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
            video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
            vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
            tie_word_embeddings=True,
            **special,
        )
        torch.manual_seed(0)
        model = Qwen2_5_VLForConditionalGeneration(config)
        model.generation_config = GenerationConfig(**special)
        model.save_pretrained(directory)
        tok.save_pretrained(directory)

    fingerprint = hashlib.sha256(json.dumps(LARGE, sort_keys=True).encode()).hexdigest()[:12]
    return build_cached(f"bench-vision-qwen2_5_vl-large-{fingerprint}", build)


def model_path(model: str) -> str:
    from steadyrl.toy.vision import vision_model_path

    return large_standin_path() if model == "standin-large" else vision_model_path("qwen2_5_vl")


def processor_448():
    """The stand-in's processor with its image processor at 448 x 448 pixels (1,024 patches, 256 image tokens)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from steadyrl.toy.vision import build_processor

    processor = build_processor("qwen2_5_vl")
    pixels = IMAGE_SIDE * IMAGE_SIDE
    processor.image_processor = Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels)
    return processor


def install_task(model: str) -> None:
    """Point vs_trl's task lookups (``real_shapes.task``, ``real_shapes.load_tokenizer``) at the vision task: every
    trainer gets the processor as ``processing_class``; the worker reads the end-of-sequence id through it."""
    from steadyrl.toy.vision import colour_dataset, colour_letters_reward

    path, processor = model_path(model), processor_448()
    processor.eos_token_id = processor.tokenizer.eos_token_id  # vs_trl's worker reads it to count generated tokens
    dataset = colour_dataset(NUM_PROMPTS, size=IMAGE_SIDE)
    real_shapes.task = lambda name, prompt_length: (path, dataset, colour_letters_reward)
    real_shapes.load_tokenizer = lambda directory: processor


# ---- the vision tower's instrument ------------------------------------------------------------------------


def instrument_tower() -> None:
    """Count and time the tower's forward calls, and time its backward, in ``vs_trl.PASS`` (reset every round and
    reported by vs_trl's worker)."""
    import torch
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as Tower

    vs_trl.PASS.update(TOWER)
    backward = {"start": None}

    class MarkBackward(torch.autograd.Function):
        """The identity; notes when the gradient reaches the tower's output (the first time in a backward pass)."""

        @staticmethod
        def forward(ctx, features):
            return features.view_as(features)

        @staticmethod
        def backward(ctx, grad):
            if backward["start"] is None:
                backward["start"] = time.process_time()
            return grad

    def accumulated(parameter) -> None:  # the patch embedding is the tower's first layer: its gradient comes last
        if backward["start"] is not None:
            vs_trl.PASS["tower_backward_s"] += time.process_time() - backward["start"]
            backward["start"] = None

    forward = Tower.forward

    def timed(self, *args, **kwargs):
        if not getattr(self, "_bench_hooked", False) and self.patch_embed.proj.weight.requires_grad:
            self.patch_embed.proj.weight.register_post_accumulate_grad_hook(accumulated)
            self._bench_hooked = True
        start = time.process_time()
        output = forward(self, *args, **kwargs)
        vs_trl.PASS["tower_forward_s"] += time.process_time() - start
        vs_trl.PASS["tower_calls"] += 1
        vs_trl.PASS["tower_images"] += len(kwargs["grid_thw"] if "grid_thw" in kwargs else args[1])
        if output.pooler_output.requires_grad:
            output.pooler_output = MarkBackward.apply(output.pooler_output)
        return output

    Tower.forward = timed


def worker(spec: dict) -> None:
    install_task(spec["model"])
    instrument_tower()
    vs_trl.worker(spec)


# ---- driver -----------------------------------------------------------------------------------------------


def tower_summary(result: dict, library: str) -> dict:
    """Per optimizer step, medians over the measured rounds: the tower's images, forward and backward seconds."""
    rows, steps = result["raw"][library][result["warmup"] :], result["steps_per_round"]

    def per_step(key: str) -> float:
        return statistics.median(r[key] / steps for r in rows)

    return {key: per_step(key) for key in TOWER}


def print_tables(results: list[dict], opts) -> None:
    print(
        f"\nmachine: {os.cpu_count()} CPU cores, {opts.threads} torch thread(s) per worker; {opts.prompts} prompts x "
        f"{opts.samples} completions of up to {opts.completion_length} tokens per rollout, {opts.train_batch} per "
        f"optimizer step, micro-batches of {opts.micro_batch}; beta {opts.beta}; "
        f"{'bf16' if opts.bf16 else 'float32'}; {IMAGE_SIDE}x{IMAGE_SIDE} images"
    )
    print(
        "\n| model | library | step wall s | ratio to TRL | step CPU s | ratio to TRL | peak RSS MB | ratio to TRL | "
        "s/step: generate, score, train | tower: images / step | tower s / step: forward, backward | tower share "
        "of the step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        trl = r["trl"]
        for library in LIBRARIES:
            a, tower = r[library], tower_summary(r, library)
            phases = ", ".join(f"{a['phases_s'][p]:.2f}" for p in ("gen", "score", "train"))
            share = (tower["tower_forward_s"] + tower["tower_backward_s"]) / a["cpu_step_s"]
            print(
                f"| {r['model']} | {library} | {a['step_s']:.2f} | {a['step_s'] / trl['step_s']:.2f} | "
                f"{a['cpu_step_s']:.2f} | {a['cpu_step_s'] / trl['cpu_step_s']:.2f} | {a['peak_rss_mb']:.0f} | "
                f"{a['peak_rss_mb'] / trl['peak_rss_mb']:.2f} | {phases} | {tower['tower_images']:.0f} | "
                f"{tower['tower_forward_s']:.2f}, {tower['tower_backward_s']:.2f} | {100 * share:.0f}% |"
            )
    print("\n| model | library | gen tok/s | mean completion length | ms per generated token |")
    print("|---|---|---|---|---|")
    for r in results:
        for library in LIBRARIES:
            a = r[library]
            print(
                f"| {r['model']} | {library} | {a['tokens_per_second']:.0f} | {a['completion_length']:.1f} | "
                f"{a['ms_per_token']:.1f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="standin,standin-large")
    parser.add_argument("--rounds", default="standin=4,standin-large=3", help="measured rounds per model")
    parser.add_argument("--warmup", default="standin=1,standin-large=1", help="warm-up rounds per model")
    parser.add_argument("--prompts", type=int, default=4, help="prompts (images) per rollout")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--train_batch", type=int, default=32, help="samples per optimizer step")
    parser.add_argument("--micro_batch", type=int, default=8, help="samples per forward/backward")
    parser.add_argument("--epochs", type=int, default=1, help="passes over a rollout (num_iterations)")
    parser.add_argument("--completion_length", type=int, default=32)
    parser.add_argument("--beta", type=float, default=0.04, help="the KL coefficient (0: no reference pass)")
    parser.add_argument("--gradient_checkpointing", action="store_true", help="on both sides (default off)")
    parser.add_argument("--bf16", action="store_true", help="bf16=True on both sides (default float32)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--profile", action="store_true", help="cProfile the measured rounds into OUTPUT_DIR/*.prof")
    parser.add_argument("--output_dir", default="bench-output/vision_vs_trl")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        import json

        return worker(json.loads(opts.worker))
    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rounds, warmup = vs_trl.per_model(opts.rounds), vs_trl.per_model(opts.warmup)
    row_opts = SimpleNamespace(**vars(opts), micro_rollout_batch=None, prompt_length=0, padded=True)
    results = []
    for model in opts.models.split(","):
        model_path(model)  # build it once here, not in three workers at once
        results.append(vs_trl.bench_row(model, "grpo-hf", rounds[model], warmup[model], row_opts, out, __file__))
    print_tables(results, opts)


if __name__ == "__main__":
    main()
