"""The rows of docs/errors.md's table ("When input is wrong") in the area multi-turn: tools, environment_factory and
rollout_func that do not fit. Each row's trigger provokes its error, checked against the table's text
(errors/error_table.py: how, and which file has which areas)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.toy_run import make_config, make_trainer

from integration.errors.error_table import AHEAD, Context, Triggers
from steadyrl.toy import toy_dataset

trigger = Triggers(__file__)


@trigger("staleness-agents")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="grpo", **AHEAD, max_staleness=1, rollout_func=lambda prompts, trainer: {})


@trigger("partial-agents")
def _(ctx):
    from support.toy_run import tool_task

    make_trainer(
        ctx.tmp_path, algorithm="grpo", **{**tool_task("tools"), **AHEAD}, max_staleness=1, partial_rollout_tokens=4
    )


@trigger("staleness-environment-reward-model")
def _(ctx):
    from support.toy_run import tool_task
    from transformers import AutoModelForSequenceClassification

    from steadyrl.toy.tools import tool_model_path

    reward_model = AutoModelForSequenceClassification.from_pretrained(tool_model_path(), num_labels=1)
    task = {**tool_task("environment"), "reward_model": reward_model}
    make_trainer(ctx.tmp_path, algorithm="grpo", **{**task, **AHEAD}, max_staleness=1)


# multi-turn


def tool_run(ctx: Context, **kwargs):
    from support.toy_run import tool_task

    return make_trainer(ctx.tmp_path, algorithm="grpo", **{**tool_task("tools"), **kwargs})


@trigger("tool-not-function")
def _(ctx):
    tool_run(ctx, tools=["add"])


@trigger("tools-text-prompts")
def _(ctx):
    tool_run(ctx, train_dataset=toy_dataset())


@trigger("tools-template")
def _(ctx):
    from steadyrl.toy.tools import tool_tokenizer

    tokenizer = tool_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tool_run(ctx, processing_class=tokenizer)


@trigger("tools-parser")
def _(ctx):
    from steadyrl.toy.tools import tool_tokenizer

    tokenizer = tool_tokenizer()
    tokenizer.response_template = None
    tool_run(ctx, processing_class=tokenizer)


@trigger("template-append-only")
def _(ctx):
    from steadyrl.toy.tools import tool_tokenizer

    tokenizer = tool_tokenizer()
    earlier = "(message.content.split('</think>')[-1] if not loop.last else message.content) }}"
    tokenizer.chat_template = tokenizer.chat_template.replace("message.content }}", earlier)
    tool_run(ctx, processing_class=tokenizer)


@trigger("template-text-free-call")
def _(ctx):
    from steadyrl.toy.tools import tool_tokenizer

    tokenizer = tool_tokenizer()  # marks the last assistant turn: a tool reply after it re-renders it
    opening = "'<|im_start|>assistant\\n' + message.content"
    assert opening in tokenizer.chat_template
    marked = "'<|im_start|>assistant\\n' + ('(last) ' if loop.last else '') + message.content"
    tokenizer.chat_template = tokenizer.chat_template.replace(opening, marked)
    tool_run(ctx, processing_class=tokenizer)


@trigger("rollout-func-and-tools")
def _(ctx):
    tool_run(ctx, rollout_func=lambda prompts, trainer: {})


class NoReset:
    def add(self, a: int, b: int) -> int:
        """Add.

        Args:
            a: a.
            b: b.
        """
        return a + b


class Calc(NoReset):
    def reset(self, **row) -> None:
        return None


@trigger("environment-reset")
def _(ctx):
    tool_run(ctx, tools=None, environment_factory=NoReset)


@trigger("environment-column")
def _(ctx):
    tool_run(ctx, tools=None, environment_factory={"calc": Calc, "game": Calc})


@trigger("environment-name")
def _(ctx):
    from steadyrl.toy.tools import sum_dataset

    dataset = sum_dataset(4).add_column("environment", ["calc", "calc", "chess", "calc"])
    tool_run(ctx, tools=None, environment_factory={"calc": Calc}, train_dataset=dataset)


def environment_owned(ctx: Context, factory, **overrides):
    from support.toy_run import tool_task

    from steadyrl import GRPOTrainer

    task = tool_task("tools")
    GRPOTrainer(
        task["model"],
        [],
        make_config(ctx.tmp_path, "grpo", max_completion_length=64, **overrides),
        processing_class=task["processing_class"],
        environment_factory=factory,
    )


@trigger("environment-data-dict")
def _(ctx):
    environment_owned(ctx, {"calc": Calc, "game": Calc}, max_steps=2)


@trigger("environment-data-max-steps")
def _(ctx):
    environment_owned(ctx, Calc, max_steps=-1)


def rollout_func_run(ctx: Context, change: Callable[[dict], dict]):
    def rollout_func(prompts, trainer):
        ids = trainer.processing_class(prompts)["input_ids"]
        output = {"prompt_ids": ids, "completion_ids": [[5, 6]] * len(ids), "logprobs": None}
        return change(output)

    make_trainer(ctx.tmp_path, algorithm="grpo", rollout_func=rollout_func, max_steps=1, save_steps=100).train()


@trigger("rollout-func-keys")
def _(ctx):
    rollout_func_run(ctx, lambda output: {k: v for k, v in output.items() if k != "logprobs"})


@trigger("rollout-func-rows")
def _(ctx):
    rollout_func_run(ctx, lambda output: {k: (v[::2] if v else v) for k, v in output.items()})


@trigger("rollout-func-env-mask")
def _(ctx):
    rollout_func_run(ctx, lambda output: {**output, "env_mask": [[1]] * len(output["prompt_ids"])})


@trigger("rollout-func-reserved-field")
def _(ctx):
    rollout_func_run(ctx, lambda output: {**output, "completions": ["text"] * len(output["prompt_ids"])})


@pytest.mark.parametrize("row_id", trigger.row_ids())
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    trigger.check(row_id, Context(tmp_path, request, monkeypatch, capsys))
