"""The rows of docs/errors.md's table ("When input is wrong") in the areas data, datasets and reward functions: a
dataset, a stream, a reward function or a judge that does not fit. Each row's trigger provokes its error, checked
against the table's text (errors/error_table.py: how, and which file has which areas)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from datasets import Dataset, IterableDataset
from support.toy_run import make_config, make_trainer

from integration.errors.error_table import Context, Triggers, conversations
from steadyrl.data.stream import StreamSampler
from steadyrl.toy import toy_dataset

trigger = Triggers(__file__)


# data


@trigger("no-prompt-column")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=Dataset.from_dict({"text": ["abc:"]}))


@trigger("train-dataset-missing")
def _(ctx):
    from steadyrl import GRPOTrainer
    from steadyrl.toy import letters_reward, toy_model_path

    GRPOTrainer(toy_model_path(), [letters_reward], make_config(ctx.tmp_path, "grpo"))


@trigger("stream-dispatch-batches")
def _(ctx):
    stream = toy_dataset(num_prompts=4).to_iterable_dataset()
    make_trainer(ctx.tmp_path, train_dataset=stream, accelerator_config={"dispatch_batches": True})


@trigger("image-column")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=toy_dataset().add_column("image", [None] * len(toy_dataset())))


@trigger("staleness-columns")
def _(ctx):
    import datetime

    from integration.errors.error_table import AHEAD

    dataset = toy_dataset(num_prompts=4)
    dataset = dataset.add_column("when", [datetime.datetime(2026, 1, d + 1) for d in range(4)])
    make_trainer(ctx.tmp_path, algorithm="grpo", train_dataset=dataset, **AHEAD, max_staleness=1)


@trigger("empty-dataset")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=Dataset.from_dict({"prompt": []}))


@trigger("dataset-type")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=[{"prompt": "abc:"}])


def prompt_stream(prompts: list) -> IterableDataset:
    def rows():
        yield from ({"prompt": prompt} for prompt in prompts)

    return IterableDataset.from_generator(rows)


@trigger("stream-max-steps")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=toy_dataset(num_prompts=4).to_iterable_dataset(), max_steps=-1)


@trigger("stream-split")
def _(ctx):
    from datasets.distributed import split_dataset_by_node

    stream = split_dataset_by_node(toy_dataset(num_prompts=4).to_iterable_dataset(), rank=0, world_size=2)
    make_trainer(ctx.tmp_path, train_dataset=stream)


@trigger("stream-bad-row")
def _(ctx):
    StreamSampler(prompt_stream(["ab:"] * 9 + [""]), conversational=False).next(10)


@trigger("stream-mixed-kind")
def _(ctx):
    StreamSampler(prompt_stream(["ab:"] * 9 + [[{"role": "user", "content": "ab:"}]]), conversational=False).next(10)


@trigger("stream-no-rows")
def _(ctx):
    passes = []

    def first_pass_only():  # a generator over a source that is used up after one pass
        passes.append(1)
        yield from ({"prompt": "ab:"} for _ in range(3 if len(passes) == 1 else 0))

    StreamSampler(IterableDataset.from_generator(first_pass_only)).next(4)


@trigger("chat-no-template")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=conversations("abc:"))


@trigger("empty-prompt")
def _(ctx):
    make_trainer(ctx.tmp_path, train_dataset=Dataset.from_dict({"prompt": ["ab:", "cd:", None], "letters": ["a"] * 3}))


@trigger("bad-message")
def _(ctx):
    prompt = [[{"role": "user", "content": None}]]
    make_trainer(ctx.tmp_path, train_dataset=Dataset.from_dict({"prompt": prompt, "letters": ["a"]}))


@trigger("eval-kind")
def _(ctx):
    make_trainer(ctx.tmp_path, eval_dataset=conversations("ab:"))


@trigger("eval-missing")
def _(ctx):
    make_trainer(ctx.tmp_path, eval_strategy="steps", eval_steps=2)


# reward functions and judges


@trigger("eval-judge")
def _(ctx):
    make_trainer(
        ctx.tmp_path,
        algorithm="online-dpo",
        reward_funcs=[],
        judge=lambda prompts, pairs: [0] * len(pairs),
        eval_dataset=toy_dataset(num_prompts=4),
    )


@trigger("reward-not-callable")
def _(ctx):
    import huggingface_hub.constants

    # offline: the same OSError at once, where this closed network makes the Hub client retry for ~45 s
    ctx.monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    make_trainer(ctx.tmp_path, reward_funcs=["letters"])


@trigger("no-reward")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[])


@trigger("reward-tokenizers-count")
def _(ctx):
    from transformers import AutoTokenizer

    from steadyrl import RLOOTrainer
    from steadyrl.toy import toy_model_path

    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    RLOOTrainer(
        toy_model_path(),
        [toy_model_path(), toy_model_path()],  # two reward models (never loaded: refused first)
        make_config(ctx.tmp_path),
        toy_dataset(),
        reward_processing_classes=tokenizer,
    )


@trigger("reward-weights-count")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_weights=[1.0, 2.0])


@trigger("reward-weights-finite")
def _(ctx):
    make_config(ctx.tmp_path, reward_weights=[math.nan])


def score(prompts, completions, **kwargs):
    raise KeyError("answer")


def short(prompts, completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def nan(prompts, completions, **kwargs):
    return [math.nan] * len(completions)


def judge(prompts, completion_pairs):
    return [0, -1] * (len(completion_pairs) // 2)  # TRL's judges answer -1 when they fail


@trigger("reward-raises")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[score]).train()


@trigger("reward-count")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[short]).train()


@trigger("reward-nan")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[nan]).train()


def never(prompts, completions, **kwargs):
    return [None] * len(completions)


async def hangs(prompts, completions, **kwargs):
    await asyncio.sleep(30)


def needs_answer(completions, answer):
    return [0.0] * len(completions)


@trigger("reward-all-none")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[never]).train()


@trigger("reward-async-timeout")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[hangs], reward_timeout=0.1).train()


def blocks(prompts, completions, **kwargs):
    time.sleep(30)


@trigger("reward-sync-timeout")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[blocks], reward_timeout=0.1).train()


@trigger("dynamic-sampling-bound")
def _(ctx):
    constant = [lambda completions, **kwargs: [1.0] * len(completions)]
    make_trainer(ctx.tmp_path, reward_funcs=constant, dynamic_sampling=True, max_num_gen_batches=2).train()


@trigger("reward-column")
def _(ctx):
    make_trainer(ctx.tmp_path, reward_funcs=[needs_answer])


@trigger("judge-answer")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="online-dpo", reward_funcs=[], judge=judge).train()


@trigger("online-dpo-beta-stream")
def _(ctx):
    stream = toy_dataset(num_prompts=8).to_iterable_dataset()
    make_trainer(ctx.tmp_path, algorithm="online-dpo", train_dataset=stream, beta=[0.1, 0.2])


@pytest.mark.parametrize("row_id", trigger.row_ids())
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    trigger.check(row_id, Context(tmp_path, request, monkeypatch, capsys))
