"""The rows of docs/errors.md's table ("When input is wrong") in the area vision: images in prompts with what does not
carry them yet, prompts that cannot hold them, and vision-language families steadyrl cannot train. Each row's trigger
provokes its error, checked against the table's text (errors/error_table.py: how, and which file has which areas)."""

from __future__ import annotations

import pytest
from support.toy_run import make_trainer, vision_task

from integration.errors.error_table import AHEAD, Context, Triggers
from steadyrl import PPOTrainer

trigger = Triggers(__file__)


def vision_run(ctx: Context, algorithm: str = "grpo", **kwargs):
    return make_trainer(ctx.tmp_path, algorithm=algorithm, **{**vision_task("qwen2_5_vl"), **kwargs})


@trigger("vision-algorithm")
def _(ctx):
    vision_run(ctx, algorithm="ppo", trainer_cls=PPOTrainer)


@trigger("vision-multi-turn")
def _(ctx):
    vision_run(ctx, rollout_func=lambda prompts, trainer: {})


@trigger("vision-tools-ahead")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="grpo", **{**vision_task("tools"), **AHEAD}, max_staleness=1)


@trigger("partial-vision")
def _(ctx):
    vision_run(ctx, **AHEAD, max_staleness=1, partial_rollout_tokens=4)


@trigger("vision-vllm-family")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="grpo", use_vllm=True, vllm_dtype="float32", **vision_task("llava_next"))


@trigger("vision-string-prompts")
def _(ctx):
    task = vision_task("qwen2_5_vl")
    dataset = task["train_dataset"].map(lambda row: {"prompt": row["prompt"][0]["content"]})
    vision_run(ctx, train_dataset=dataset)


@trigger("vision-prompt-length")
def _(ctx):
    vision_run(ctx, max_prompt_length=16, max_steps=1).train()


@trigger("vision-family")
def _(ctx):
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    text = dict(model_type="llama", vocab_size=128, **sizes)
    model = Idefics3ForConditionalGeneration(
        Idefics3Config(text_config=text, vision_config=dict(image_size=28, patch_size=14, **sizes))
    )
    vision_run(ctx, model=model)


@pytest.mark.parametrize("row_id", trigger.row_ids())
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    trigger.check(row_id, Context(tmp_path, request, monkeypatch, capsys))
