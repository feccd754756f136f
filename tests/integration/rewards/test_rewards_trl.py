"""Reward functions as TRL's: the summed rewards (async functions, None for the samples a function does not apply to)
compared with TRL's GRPOTrainer on the same inputs, a parameter no call passes refused when the trainer is built, and
None rewards through training, evaluation and resume. Scoring alone (no trainer): tests/unit/test_rewards.py."""

from __future__ import annotations

import asyncio
import functools
import json
import math

import pytest
import torch
from datasets import Dataset
from support.toy_run import make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer
from unit.test_rewards import COMPLETIONS, PROMPTS, TASKS, reward_inputs

from steadyrl.ops import group_normalized_total
from steadyrl.rewards import is_async_reward, score_completions, weighted_total
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path


def length_reward(completions, task, **kwargs):
    """Applies to the 'length' and 'both' tasks only (multi-task: None elsewhere)."""
    return [None if t == "letters" else len(c) / 3 for c, t in zip(completions, task)]


async def async_letters(completions, task, **kwargs):
    """Applies to the 'letters' and 'both' tasks; sleeps so that it overlaps the other async function."""
    await asyncio.sleep(0.01)
    return [None if t == "length" else sum(ch in "abcmop" for ch in c) / len(c) for c, t in zip(completions, task)]


class AsyncVowels:
    """A callable object whose __call__ is async (TRL's is_async_callable reads __call__)."""

    __name__ = "async_vowels"

    async def __call__(self, completions, **kwargs):
        await asyncio.sleep(0.02)
        return [sum(ch in "aeiou" for ch in c) for c in completions]


def scaled(completions, factor, **kwargs):
    return [factor * len(c) for c in completions]


REWARDS = [length_reward, async_letters, AsyncVowels(), functools.partial(scaled, factor=0.5)]
WEIGHTS = [1.0, 2.0, 0.5, -1.0]


@pytest.fixture(scope="module")
def trl_grpo(tmp_path_factory):
    """TRL's own GRPOTrainer on the toy model, with the same reward functions and weights."""
    import trl

    path = tmp_path_factory.mktemp("trl-grpo")
    args = trl.GRPOConfig(
        output_dir=str(path),
        per_device_train_batch_size=6,
        num_generations=2,
        report_to="none",
        use_cpu=True,
        bf16=False,
        reward_weights=WEIGHTS,
        max_completion_length=4,
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS[::2], "task": TASKS[::2]})
    return trl.GRPOTrainer(
        AutoModelForCausalLM.from_pretrained(toy_model_path()),
        reward_funcs=REWARDS,
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(toy_model_path()),
    )


def test_async_and_none_rewards_sum_as_trls(trl_grpo):
    inputs = [{"prompt": p, "task": t} for p, t in zip(PROMPTS, TASKS)]
    trl_per_func = trl_grpo._calculate_rewards(inputs, PROMPTS, COMPLETIONS, [[1]] * len(PROMPTS))
    trl_total = (trl_per_func * trl_grpo.reward_weights.unsqueeze(0)).nansum(dim=1)

    scores = score_completions(REWARDS, reward_inputs())
    assert trl_per_func.isnan().any(), "some function must return None"
    torch.testing.assert_close(scores, trl_per_func, equal_nan=True)
    torch.testing.assert_close(weighted_total(scores, torch.tensor(WEIGHTS)), trl_total)
    assert [is_async_reward(f) for f in REWARDS] == [False, True, True, False]


def test_normalize_then_sum_is_trls_with_none(trl_grpo):
    """TRL's normalize_then_sum (inline in _generate_and_score_completions), with its nanstd, on a None column."""
    from trl.trainer.utils import nanstd

    scores = score_completions(REWARDS, reward_inputs())
    weights = torch.tensor(WEIGHTS)
    grouped = scores.view(-1, 2, scores.shape[1])
    mean_k, std_k = torch.nanmean(grouped, dim=1, keepdim=True), nanstd(grouped, dim=1, keepdim=True)
    expected = (((grouped - mean_k) / (std_k + 1e-4)).view(-1, scores.shape[1]) * weights).nansum(dim=1)
    torch.testing.assert_close(group_normalized_total(scores, weights, 2), expected)


# ---- built trainers ---------------------------------------------------------------------------------------------


def test_a_parameter_no_call_passes_is_refused_when_the_trainer_is_built(tmp_path):
    def needs_answer(completions, answer):
        return [0.0] * len(completions)

    message = (
        r"reward_funcs\[1\] 'needs_answer' needs the parameter 'answer', which no call passes: .* the "
        r"dataset's columns besides 'prompt' are \['letters'\]"
    )
    with pytest.raises(ValueError, match=message):
        make_trainer(tmp_path, reward_funcs=[letters_reward, needs_answer])


def test_a_column_removed_by_remove_unused_columns_is_named(tmp_path):
    def strict_letters(completions, letters):
        return [0.0] * len(completions)

    with pytest.raises(
        ValueError,
        match=r"remove_unused_columns=True passes no dataset column \(the dataset has "
        r"\['letters'\]\)",
    ):
        make_trainer(tmp_path, reward_funcs=[strict_letters], remove_unused_columns=True)


def test_functions_with_kwargs_defaults_or_passed_names_are_accepted(tmp_path):
    def by_columns(prompts, completions, completion_ids, letters, trainer_state, log_metric, environments=None):
        return [0.0] * len(completions)

    def optional(completions, answer=None):
        return [0.0] * len(completions)

    make_trainer(tmp_path, reward_funcs=[by_columns, optional, letters_reward, AsyncVowels()])


def multi_task_dataset() -> Dataset:
    base = toy_dataset()
    return base.add_column("task", ["letters" if i % 2 else "length" for i in range(len(base))])


def test_grpo_trains_with_an_async_and_a_multi_task_reward(tmp_path):
    """Two rollouts (2 steps each): the async reward and the None reward are summed per sample; trainer_state is the
    trainer's state at each rollout; log_metric reaches the logs."""
    steps_seen = []

    def length_only(completions, task, trainer_state, log_metric, **kwargs):
        steps_seen.append(trainer_state.global_step)
        log_metric("length_share", sum(t == "length" for t in task) / len(task))
        return [None if t == "letters" else min(len(c), 8) / 8 for c, t in zip(completions, task)]

    async def letters_only(completions, task, letters, **kwargs):
        await asyncio.sleep(0)
        scores = letters_reward(completions=completions, letters=letters)
        return [s if t == "letters" else None for s, t in zip(scores, task)]

    trainer = make_trainer(
        tmp_path,
        algorithm="grpo",
        reward_funcs=[length_only, letters_only],
        train_dataset=multi_task_dataset(),
        num_ppo_epochs=1,
        max_steps=4,
        save_steps=100,
        reward_timeout=60,
        reward_weights=[1.0, 2.0],
        log_completions=True,
    )
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert lines and all(list(line["rewards"].values()).count(None) == 1 for line in lines), "None shows as null"
    assert steps_seen == [0, 2]
    rollout = trainer.training_buffer.buffer.rollout  # the last one
    scores = rollout.reward_scores  # [N, 2]: one of the two None per sample
    assert (scores.isnan().sum(1) == 1).all()
    torch.testing.assert_close(rollout.scores, weighted_total(scores, torch.tensor([1.0, 2.0])))
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert logs and all(math.isfinite(entry["reward"]) for entry in logs)
    # each function's mean where it applied; NaN in a rollout where it applied to no sample (as TRL's nanmean)
    assert all(
        {"rewards/length_only/mean", "rewards/letters_only/mean", "length_share"} <= entry.keys() for entry in logs
    )


def test_grpo_normalize_then_sum_trains_with_none_rewards(tmp_path):
    def length_only(completions, task, **kwargs):
        return [None if t == "letters" else len(c) / 8 for c, t in zip(completions, task)]

    def letters_only(completions, task, letters, **kwargs):
        scores = letters_reward(completions=completions, letters=letters)
        return [s if t == "letters" else None for s, t in zip(scores, task)]

    trainer = make_trainer(
        tmp_path,
        algorithm="grpo",
        reward_funcs=[length_only, letters_only],
        train_dataset=multi_task_dataset(),
        num_ppo_epochs=1,
        max_steps=2,
        save_steps=100,
        multi_objective_aggregation="normalize_then_sum",
    )
    trainer.train()
    assert torch.isfinite(trainer.training_buffer.buffer.rollout.advantages).all()
    assert all(math.isfinite(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry)


def half_length(completions, task, **kwargs):
    return [None if t == "letters" else len(c) / 8 for c, t in zip(completions, task)]


def half_letters(completions, task, letters, **kwargs):
    return [s if t == "letters" else None for s, t in zip(letters_reward(completions, letters), task)]


def test_a_checkpoint_holding_none_rewards_resumes_identically(tmp_path):
    """checkpoint-3 falls mid-rollout: its buffer's reward_scores hold NaN (the None rewards); the resumed run ends
    with the uninterrupted run's weights, byte for byte."""
    import shutil

    def run(output_dir, resume: bool):
        trainer = make_trainer(
            output_dir,
            algorithm="grpo",
            reward_funcs=[half_length, half_letters],
            train_dataset=multi_task_dataset(),
            num_ppo_epochs=1,
            max_steps=4,
            save_steps=3,
        )
        trainer.train(resume_from_checkpoint=resume or None)
        trainer.save_model(str(output_dir / "final-actor"))
        return trainer

    run(tmp_path / "whole", resume=False)
    from safetensors.torch import load_file

    buffer = load_file(tmp_path / "whole" / "checkpoint-3" / "rollout_buffer_0.safetensors")
    assert buffer["rollout.reward_scores"].isnan().any(), "the checkpointed buffer must hold a None reward"
    shutil.copytree(tmp_path / "whole" / "checkpoint-3", tmp_path / "resumed" / "checkpoint-3")
    run(tmp_path / "resumed", resume=True)
    expected = (tmp_path / "whole" / "final-actor" / "model.safetensors").read_bytes()
    assert (tmp_path / "resumed" / "final-actor" / "model.safetensors").read_bytes() == expected


def test_evaluation_means_leave_out_none(tmp_path):
    """eval_rewards/<name>/mean is the mean over the samples the function applied to; eval_reward sums the others."""
    dataset = multi_task_dataset()
    trainer = make_trainer(
        tmp_path,
        reward_funcs=[half_length, half_letters],
        train_dataset=dataset,
        eval_dataset=dataset.select(range(4)),
        num_generations_eval=2,
    )
    metrics = trainer.evaluate()
    assert all(math.isfinite(value) for value in metrics.values()), metrics
    assert 0 <= metrics["eval_rewards/half_letters/mean"] <= 1 and metrics["eval_rewards/half_length/mean"] > 0


@pytest.mark.parametrize("algorithm", ["rloo", "ppo", "online-dpo"])
def test_every_algorithm_trains_on_none_rewards(tmp_path, algorithm):
    trainer = make_trainer(
        tmp_path,
        algorithm=algorithm,
        reward_funcs=[half_length, half_letters],
        train_dataset=multi_task_dataset(),
        max_steps=2,
        save_steps=100,
    )
    trainer.train()
    rollout = trainer.training_buffer.buffer.rollout
    assert rollout.reward_scores.isnan().any() and torch.isfinite(rollout.scores).all()
    assert all(math.isfinite(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry)
