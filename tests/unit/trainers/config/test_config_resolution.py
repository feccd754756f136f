"""Config resolution on its own (configs built, nothing trained): the batch hierarchy from steadyrl's or TRL's
names, contradictions between the two refused naming both values, batch sizes that do not divide refused in TRL's
terms, and the value checks of fields with TRL's names."""

from __future__ import annotations

import dataclasses
import re

import pytest

from steadyrl import OnlineDPOConfig, PPOConfig, RLOOConfig
from steadyrl.trainers.config.batch_hierarchy import BatchSettings, resolve_batch_hierarchy


def build(config_class, tmp_path, **settings):
    """(config, None), or (None, the ValueError's message)."""
    try:
        return config_class(output_dir=str(tmp_path), report_to="none", use_cpu=True, **settings), None
    except ValueError as err:
        return None, str(err)


def test_default_hierarchy_is_trls(tmp_path):
    """Nothing set: a micro-batch of 8, no accumulation, one rollout per optimizer step."""
    for config_class, expected in [
        (RLOOConfig, dict(micro_train_batch_size=8, train_batch_size=8, rollout_batch_size=2, n_samples_per_prompt=4)),
        (PPOConfig, dict(micro_train_batch_size=8, train_batch_size=8, rollout_batch_size=2, n_samples_per_prompt=4)),
        (
            OnlineDPOConfig,
            dict(micro_train_batch_size=16, train_batch_size=16, rollout_batch_size=8, n_samples_per_prompt=2),
        ),
    ]:
        config, error = build(config_class, tmp_path)
        assert error is None, error
        assert {key: getattr(config, key) for key in expected} == expected, config_class.__name__
        assert (config.gradient_accumulation_steps, config.num_ppo_epochs, config.steps_per_rollout) == (1, 1, 1)
        assert (config.cliprange, config.cliprange_high, config.micro_rollout_batch_size) == (0.2, 0.2, 8)


def test_resolution_over_several_processes():
    two = resolve_batch_hierarchy(BatchSettings(per_device_train_batch_size=2, gradient_accumulation_steps=2), 4, 2)
    assert (two.train_batch_size, two.rollout_batch_size, two.micro_rollout_batch_size) == (8, 2, 4)
    with pytest.raises(ValueError, match=r"rollout_batch_size=1 \(.*\) cannot be split over 2 processes"):
        resolve_batch_hierarchy(BatchSettings(per_device_train_batch_size=1), 2, 2)
    three = BatchSettings(rollout_batch_size=6, train_batch_size=12, micro_train_batch_size=4)
    three = resolve_batch_hierarchy(three, 2, 3)
    assert three.micro_rollout_batch_size == 4, "the largest divisor up to 8 of each process's 4 samples"


@pytest.mark.parametrize(
    "given, world, completions_per_item, micro",
    [
        (dict(train_batch_size=48), 1, 1, 8),  # the largest divisor of 48 up to 8
        (dict(train_batch_size=12), 1, 1, 6),
        (dict(train_batch_size=12), 2, 1, 6),  # 6 of the 12 per process
        (dict(train_batch_size=16, gradient_accumulation_steps=4), 1, 1, 4),  # exactly the share
        (dict(train_batch_size=8, rollout_batch_size=4), 1, 2, 8),  # online DPO: up to 16, even
        (dict(train_batch_size=12, rollout_batch_size=6), 1, 2, 12),
        (dict(), 1, 2, 16),  # online DPO's default: TRL's 8 prompts per device
    ],
)
def test_micro_batch_follows_a_given_train_batch_size(given, world, completions_per_item, micro):
    hierarchy = resolve_batch_hierarchy(BatchSettings(**given), 2, world, completions_per_item)
    assert hierarchy.micro_train_batch_size == micro


def test_a_resolved_config_is_accepted_again(tmp_path):
    for config_class, settings in [
        (RLOOConfig, dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=4)),
        (OnlineDPOConfig, dict(per_device_train_batch_size=2, max_new_tokens=16, max_length=80)),
        (PPOConfig, dict(rollout_batch_size=4, n_samples_per_prompt=1, train_batch_size=2, micro_train_batch_size=1)),
    ]:
        config, error = build(config_class, tmp_path, **settings)
        assert error is None, error
        again = dataclasses.replace(config)
        assert all(getattr(again, f.name) == getattr(config, f.name) for f in dataclasses.fields(config))


PER_DEVICE = "per device x 1 process(es)"  # steps_per_generation's term, after "steps_per_generation=S x M completions"


CONTRADICTIONS = [  # config class, settings, the message's start
    (
        RLOOConfig,
        dict(num_generations=8, n_samples_per_prompt=4),
        "num_generations=8 contradicts n_samples_per_prompt=4",
    ),
    (
        RLOOConfig,
        dict(per_device_train_batch_size=4, micro_train_batch_size=8),
        "per_device_train_batch_size=4 contradicts micro_train_batch_size=8",
    ),
    (
        OnlineDPOConfig,
        dict(per_device_train_batch_size=4, micro_train_batch_size=4),
        "per_device_train_batch_size=4 contradicts micro_train_batch_size=4: online DPO's",
    ),
    (
        RLOOConfig,
        dict(train_batch_size=16, gradient_accumulation_steps=4, micro_train_batch_size=8),
        "gradient_accumulation_steps=4 contradicts the batch hierarchy, which derives 2 (train_batch_size=16",
    ),
    (
        RLOOConfig,
        dict(rollout_batch_size=4, generation_batch_size=32),
        "generation_batch_size=32 contradicts rollout_batch_size=4",
    ),
    (
        RLOOConfig,
        dict(rollout_batch_size=4, steps_per_generation=4),
        f"steps_per_generation=4 x 8 completions {PER_DEVICE} = 32 contradicts rollout_batch_size=4",
    ),
    (
        RLOOConfig,
        dict(generation_batch_size=16, steps_per_generation=1),
        f"steps_per_generation=1 x 8 completions {PER_DEVICE} = 8 contradicts generation_batch_size=16",
    ),
    (RLOOConfig, dict(num_iterations=2, num_ppo_epochs=1), "num_iterations=2 contradicts num_ppo_epochs=1"),
    (RLOOConfig, dict(epsilon=0.1, cliprange=0.2), "epsilon=0.1 contradicts cliprange=0.2"),
    (RLOOConfig, dict(epsilon_high=0.28, cliprange_high=0.2), "epsilon_high=0.28 contradicts cliprange_high=0.2"),
    (
        RLOOConfig,
        dict(vllm_max_model_length=2048, vllm_max_model_len=1024),
        "vllm_max_model_length=2048 contradicts vllm_max_model_len=1024",
    ),
    (
        OnlineDPOConfig,
        dict(max_new_tokens=32, max_completion_length=64),
        "max_new_tokens=32 contradicts max_completion_length=64",
    ),
    (OnlineDPOConfig, dict(max_length=300, max_prompt_length=512), "max_length=300 contradicts max_prompt_length=512"),
]


@pytest.mark.parametrize("config_class, settings, message", CONTRADICTIONS, ids=lambda v: getattr(v, "__name__", None))
def test_contradictions_are_refused_naming_both_values(tmp_path, config_class, settings, message):
    config, error = build(config_class, tmp_path, **settings)
    assert error is not None and error.startswith(message), error
    for name, value in settings.items():
        if name != "micro_train_batch_size" or config_class is RLOOConfig:  # derived ones are named by value
            assert f"{name}={value}" in error, (name, error)
    if "contradicts" in message and "batch hierarchy" not in message:
        assert error.endswith("give one of them."), error


def test_both_names_with_the_same_value_are_accepted(tmp_path):
    same = dict(
        num_generations=4,
        n_samples_per_prompt=4,
        epsilon=0.2,
        cliprange=0.2,
        num_iterations=2,
        num_ppo_epochs=2,
        per_device_train_batch_size=4,
        micro_train_batch_size=4,
    )
    config, error = build(RLOOConfig, tmp_path, **same)
    assert error is None and config.n_samples_per_prompt == 4, error


@pytest.mark.parametrize(
    "config_class, settings, message",
    [
        (RLOOConfig, dict(num_generations=1), r"^num_generations=1 is invalid for RLOO: the leave-one-out baseline"),
        (OnlineDPOConfig, dict(num_generations=4), r"^num_generations=4 is invalid for online DPO.*num_generations=2"),
        (
            RLOOConfig,
            dict(generation_batch_size=10),
            r"^The 10 completions of a rollout \(generation_batch_size=10\) are not a multiple of "
            r"n_samples_per_prompt=4.* Use a generation_batch_size in 8, 16, 24\.$",
        ),
        (
            RLOOConfig,
            dict(per_device_train_batch_size=2, num_generations=4),
            r"^The 2 completions .* not a multiple of num_generations=4.*Use gradient_accumulation_steps=2",
        ),
        (
            RLOOConfig,
            dict(
                per_device_train_batch_size=2, gradient_accumulation_steps=4, steps_per_generation=2, num_generations=2
            ),
            r"not whole optimizer steps of 8.*multiple of gradient_accumulation_steps=4, e\.g\. 4, 8, 12\.$",
        ),
        (
            RLOOConfig,
            dict(gradient_accumulation_steps=2, generation_batch_size=24),
            r"not whole optimizer steps of 16 .* Use a generation_batch_size in 16, 32, 48\.$",
        ),
        (OnlineDPOConfig, dict(max_length=64), r"^max_length=64 leaves no room for the prompt"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_inexact_trl_batch_sizes_are_refused_in_trls_terms(tmp_path, config_class, settings, message):
    _, error = build(config_class, tmp_path, **settings)
    assert error is not None and re.search(message, error), error


def test_pad_to_multiple_of_takes_trls_values(tmp_path):
    for value in ("auto", None, "none", "null"):  # the strings: from the command line
        config, error = build(RLOOConfig, tmp_path, pad_to_multiple_of=value)
        assert error is None and config.pad_to_multiple_of is None, (value, error)
    for value in (64, "64"):
        config, error = build(RLOOConfig, tmp_path, pad_to_multiple_of=value)
        assert error is None and config.pad_to_multiple_of == 64, (value, error)
    for value in (0, -8, "eight", True):
        assert "is invalid: give a positive integer" in build(RLOOConfig, tmp_path, pad_to_multiple_of=value)[1]


def test_dict_fields_take_json_from_the_command_line(tmp_path):
    dicts = dict(
        model_init_kwargs='{"dtype": "bfloat16"}',
        generation_kwargs={"suppress_tokens": [0]},
        chat_template_kwargs='{"enable_thinking": false}',
    )
    config, _ = build(RLOOConfig, tmp_path, **dicts)
    assert config.model_init_kwargs == {"dtype": "bfloat16"}
    assert config.generation_kwargs == {"suppress_tokens": [0]}
    assert config.chat_template_kwargs == {"enable_thinking": False}
    _, error = build(RLOOConfig, tmp_path, generation_kwargs="{bad json")
    assert error.startswith("generation_kwargs='{bad json' is invalid: give a dict, or on the command line a JSON")
    assert build(RLOOConfig, tmp_path, model_init_kwargs="[1]")[1].startswith("model_init_kwargs='[1]' is invalid")


@pytest.mark.parametrize(
    "config_class, settings, message",
    [
        (RLOOConfig, dict(min_p=1.5), r"min_p=1.5 is invalid: it must be in \[0, 1\]"),
        (RLOOConfig, dict(repetition_penalty=0.0), r"repetition_penalty=0.0 is invalid: it must be a finite number"),
        (RLOOConfig, dict(num_completions_to_print=0), r"num_completions_to_print=0 is invalid: it must be a positive"),
        (RLOOConfig, dict(num_generations_eval=0), r"num_generations_eval=0 is invalid"),
        (RLOOConfig, dict(epsilon_high=-0.1), r"cliprange_high=-0.1 is invalid: it must be a finite number > 0"),
        (RLOOConfig, dict(reward_clip_range=[1.0, -1.0]), r"reward_clip_range=\[1.0, -1.0\] is invalid: give \(min,"),
        (RLOOConfig, dict(reward_clip_range=[1.0]), r"reward_clip_range=\[1.0\] is invalid"),
        (RLOOConfig, dict(shuffle_dataset="no"), r"shuffle_dataset='no' is invalid: it must be True or False"),
        (OnlineDPOConfig, dict(reward_model_path=3), r"reward_model_path=3 is invalid"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_new_fields_are_checked(tmp_path, config_class, settings, message):
    _, error = build(config_class, tmp_path, **settings)
    assert error is not None and re.search(message, error), error


def test_new_fields_keep_their_values(tmp_path):
    settings = dict(
        min_p=0.05,
        repetition_penalty=1.1,
        cache_implementation="static",
        trust_remote_code=True,
        disable_dropout=True,
        shuffle_dataset=False,
        mask_truncated_completions=True,
        log_completions=True,
        num_completions_to_print=3,
        num_generations_eval=2,
        log_multimodal=False,
    )
    config, _ = build(RLOOConfig, tmp_path, reward_clip_range=[-1, 2], **settings)
    assert {name: getattr(config, name) for name in settings} == settings
    assert config.reward_clip_range == (-1.0, 2.0) and config.remove_unused_columns is False
    assert build(OnlineDPOConfig, tmp_path)[0].disable_dropout is True, "TRL's online DPO default"
