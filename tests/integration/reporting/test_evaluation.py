"""Held-out evaluation: eval_* metrics every eval_steps, comparable runs, and training unchanged by it."""

import math

import pytest
import torch
from support.toy_run import make_trainer

from steadyrl.toy import letters_reward, toy_dataset

EVAL = dict(eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4)


def training_logs(trainer):
    return [
        {k: v for k, v in log.items() if k != "tokens_per_second"} for log in trainer.state.log_history if "loss" in log
    ]


@pytest.mark.parametrize("use_vllm", [False, True], ids=["hf", "vllm"])
def test_evaluation_logs_eval_metrics_and_leaves_training_unchanged(tmp_path, use_vllm):
    plain = make_trainer(tmp_path / "plain", max_steps=6, save_steps=6, use_vllm=use_vllm)
    plain.train()
    held_out = toy_dataset(num_prompts=5, seed=1)  # 5 prompts: the last chunk of 4 is partial
    evaluated = make_trainer(
        tmp_path / "eval",
        max_steps=6,
        save_steps=6,
        use_vllm=use_vllm,
        eval_dataset=held_out,
        num_generations_eval=3,
        **EVAL,
    )
    evaluated.train()

    for name, param in plain.model.named_parameters():
        assert torch.equal(param, evaluated.model.get_parameter(name)), name
    assert training_logs(plain) == training_logs(evaluated)
    evals = [log for log in evaluated.state.log_history if "eval_reward" in log]
    assert [log["step"] for log in evals] == [2, 4, 6]
    expected = {
        "eval_reward",
        "eval_reward_std",
        "eval_rewards/letters_reward/mean",
        "eval_rewards/letters_reward/std",
        "eval_completions/mean_length",
        "eval_completions/min_length",
        "eval_completions/max_length",
        "eval_completions/clipped_ratio",
        "eval_loss",  # the evaluation rollout's loss, as TRL's (RLOO and GRPO)
        "step",
        "epoch",
    }
    assert set(evals[0]) == expected
    assert evals[0]["eval_reward"] == evals[0]["eval_rewards/letters_reward/mean"]  # one reward function, weight 1
    assert all(math.isfinite(log["eval_loss"]) for log in evals) and len({log["eval_loss"] for log in evals}) > 1

    again = evaluated.evaluate()  # the same policy and seeds: the same completions, so the same metrics
    assert again == {key: value for key, value in evals[-1].items() if key != "step"}


def test_evaluation_scores_exactly_the_completions_it_generates(tmp_path):
    """The metrics are those of num_generations_eval completions of every held-out prompt, scored by the reward
    functions: checked by recording what the reward function saw."""
    seen = []

    def recording(prompts, completions, letters, **kwargs):
        values = letters_reward(completions, letters)
        seen.append((list(prompts), values))
        return values

    held_out = toy_dataset(num_prompts=3, seed=2)
    trainer = make_trainer(
        tmp_path, reward_funcs=[recording], eval_dataset=held_out, num_generations_eval=2, max_steps=1
    )
    metrics = trainer.evaluate()
    prompts, values = seen[-1]
    assert prompts == [p for p in held_out["prompt"] for _ in range(2)]
    assert metrics["eval_reward"] == pytest.approx(sum(values) / len(values))
    assert metrics["eval_reward_std"] == pytest.approx(torch.tensor(values).std().item())


def test_eval_dataset_of_another_dataset_in_evaluate(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1)
    metrics = trainer.evaluate(toy_dataset(num_prompts=2, seed=3), metric_key_prefix="holdout")
    assert {"holdout_reward", "holdout_completions/mean_length"} <= set(metrics)
    with pytest.raises(ValueError, match="eval_dataset\\['prompt'\\]\\[1\\] is None"):
        from datasets import Dataset

        trainer.evaluate(Dataset.from_dict({"prompt": ["ab:", None], "letters": ["ab", "ab"]}))


def test_a_dict_of_eval_datasets_is_evaluated_one_by_one_with_its_names(tmp_path):
    """As ``Trainer``: ``eval_dataset={"a": ..., "b": ...}`` logs ``eval_a_*`` and ``eval_b_*``, and each dataset's
    metrics are those of evaluating it alone."""
    held_out = {"a": toy_dataset(num_prompts=2, seed=3), "b": toy_dataset(num_prompts=3, seed=4)}
    trainer = make_trainer(tmp_path, max_steps=1, eval_dataset=held_out)
    metrics = trainer.evaluate()
    assert {"eval_a_reward", "eval_b_reward", "eval_a_completions/mean_length"} <= set(metrics)
    alone = trainer.evaluate(held_out["b"], metric_key_prefix="eval_b")
    assert {k: v for k, v in alone.items() if k != "epoch"} == {k: v for k, v in metrics.items() if "eval_b_" in k}
    with pytest.raises(ValueError, match=r"eval_dataset\['c'\]\['prompt'\]\[1\] is None"):
        from datasets import Dataset

        trainer.evaluate({"c": Dataset.from_dict({"prompt": ["ab:", None], "letters": ["ab", "ab"]})})


def test_a_streaming_eval_dataset_is_evaluated_as_its_map_style_copy(tmp_path):
    """As TRL: a ``datasets.IterableDataset`` (alone or in a dict) is accepted as eval_dataset, at construction and
    in ``evaluate()``, read whole at each evaluation; its metrics are those of the same prompts as a ``Dataset``."""
    held_out = toy_dataset(num_prompts=3, seed=4)
    trainer = make_trainer(tmp_path, max_steps=1, eval_dataset={"s": held_out.to_iterable_dataset()})
    streamed = trainer.evaluate()
    mapped = trainer.evaluate({"s": held_out})
    assert streamed == mapped and "eval_s_reward" in streamed
    assert trainer.evaluate(held_out.to_iterable_dataset()) == trainer.evaluate(held_out)
