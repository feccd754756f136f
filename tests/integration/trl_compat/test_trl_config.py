"""A TRL config as a trainer's ``args``: converted field by field into steadyrl's config (the values set are kept,
unsupported ones refused with steadyrl's messages), or refused naming both classes by module."""

import dataclasses
import os
import warnings

import pytest
import trl
from accelerate import PartialState
from transformers import TrainingArguments

from steadyrl import GRPOConfig, GRPOTrainer, PPOTrainer, RLOOConfig, RLOOTrainer
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path
from steadyrl.trainers.config.trl_config import as_own_config
from steadyrl.trainers.online_dpo import OnlineDPOConfig

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from trl.experimental.online_dpo import OnlineDPOConfig as TRLOnlineDPOConfig

CPU = {"bf16": False, "report_to": "none"}  # TRL resolves bf16=None to True, which a CPU-only machine refuses


def grpo_trainer(args, **kwargs):
    return GRPOTrainer(
        model=toy_model_path(), reward_funcs=[letters_reward], args=args, train_dataset=toy_dataset(), **kwargs
    )


def test_a_trl_grpo_config_is_converted_keeping_the_values_set(tmp_path):
    given = trl.GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=4,
        per_device_train_batch_size=4,
        steps_per_generation=2,
        max_completion_length=8,
        epsilon_high=0.28,
        loss_type="dr_grpo",
        beta=0.04,
        scale_rewards=False,
        learning_rate=3e-6,
        logging_steps=5,
        save_steps=3,
        max_steps=2,
        seed=7,
        **CPU,
    )
    trainer = grpo_trainer(given)
    args = trainer.args
    assert type(args) is GRPOConfig
    assert (args.n_samples_per_prompt, args.micro_train_batch_size, args.steps_per_generation) == (4, 4, 2)
    assert args.rollout_batch_size == 2  # 4 x 1 process x 2 steps per generation = 8 completions, 2 prompts
    assert (args.max_completion_length, args.cliprange_high, args.loss_type) == (8, 0.28, "dr_grpo")
    assert (args.beta, args.scale_rewards, args.learning_rate) == (0.04, "none", 3e-6)
    assert (args.logging_steps, args.save_steps, args.max_steps, args.seed) == (5, 3, 2, 7)
    assert args.output_dir == str(tmp_path) and trainer.ref_model is not None  # beta > 0: a reference model


@pytest.mark.parametrize(
    ("trl_class", "own_class", "settings", "expected"),
    [
        (
            trl.RLOOConfig,
            RLOOConfig,
            dict(num_generations=2, beta=0.1, normalize_advantages=True),
            dict(n_samples_per_prompt=2, beta=0.1, normalize_advantages=True),
        ),
        (
            TRLOnlineDPOConfig,
            OnlineDPOConfig,
            dict(max_new_tokens=12, temperature=0.7, loss_type="ipo"),
            dict(max_completion_length=12, temperature=0.7, loss_type="ipo"),
        ),
    ],
)
def test_trl_rloo_and_online_dpo_configs_are_converted(tmp_path, trl_class, own_class, settings, expected):
    converted = as_own_config(trl_class(output_dir=str(tmp_path), logging_steps=3, **settings, **CPU), own_class)
    assert type(converted) is own_class
    assert {name: getattr(converted, name) for name in expected} == expected
    assert converted.logging_steps == 3


def test_trl_defaults_carry_over(tmp_path):
    """Every field is passed with TRL's value, defaults included (TRL's default num_generations=2 for RLOO cannot be
    told from a given one); the derived ones (report_to, accelerator_config) are built again from them."""
    given = trl.RLOOConfig(output_dir=str(tmp_path), **CPU)
    converted = as_own_config(given, RLOOConfig)
    assert (converted.n_samples_per_prompt, converted.max_completion_length, converted.logging_steps) == (2, 512, 10)
    assert (converted.gradient_checkpointing, converted.learning_rate, converted.bf16) == (True, 1e-6, False)
    assert converted.report_to == [] and converted.accelerator_config is not given.accelerator_config


def test_the_accelerator_state_is_made_once_by_the_conversion(tmp_path, monkeypatch):
    given = trl.GRPOConfig(output_dir=str(tmp_path), **CPU)
    made = []
    init = PartialState.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(PartialState, "__init__", counting)
    as_own_config(given, GRPOConfig)
    assert len(made) == 1  # steadyrl's config's own; no TRL config is built to read defaults


def test_an_unsupported_trl_value_is_refused_with_steadyrls_message(tmp_path):
    given = trl.GRPOConfig(output_dir=str(tmp_path), vllm_model_impl="transformers", **CPU)
    with pytest.raises(ValueError, match=r"^vllm_model_impl='transformers' is not supported: vLLM's Transformers "):
        grpo_trainer(given)
    honoured = as_own_config(trl.GRPOConfig(output_dir=str(tmp_path), top_entropy_quantile=0.2, **CPU), GRPOConfig)
    assert honoured.top_entropy_quantile == 0.2  # TRL 1.16's entropy masking: a setting of steadyrl's GRPO


def test_a_config_of_another_algorithm_is_refused_naming_both_modules(tmp_path):
    with pytest.raises(TypeError) as refused:
        grpo_trainer(trl.RLOOConfig(output_dir=str(tmp_path), **CPU))
    message = str(refused.value)
    assert "trl.trainer.rloo_config.RLOOConfig" in message and "steadyrl.trainers.grpo.GRPOConfig" in message
    assert "another algorithm" in message
    with pytest.raises(TypeError, match=r"trl\.trainer\.grpo_config\.GRPOConfig, a config of another algorithm"):
        as_own_config(trl.GRPOConfig(output_dir=str(tmp_path), **CPU), PPOTrainer.config_class)


def test_a_config_that_is_no_trl_or_own_config_is_refused_naming_both_classes(tmp_path):
    plain = TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    with pytest.raises(
        TypeError,
        match=r"^args must be a steadyrl\.trainers\.rloo\.RLOOConfig \(or TRL's RLOOConfig, "
        r"converted field by field\), got transformers\.training_args\.TrainingArguments\.$",
    ):
        RLOOTrainer(model=toy_model_path(), reward_funcs=[letters_reward], args=plain, train_dataset=toy_dataset())
    with pytest.raises(TypeError, match=r"got steadyrl\.trainers\.grpo\.GRPOConfig\.$"):
        as_own_config(GRPOConfig(output_dir=str(tmp_path)), RLOOConfig)


@dataclasses.dataclass
class GRPOConfigWithAFlag(trl.GRPOConfig):
    my_flag: bool = False


def test_a_set_field_steadyrl_does_not_know_is_refused(tmp_path):
    assert type(as_own_config(GRPOConfigWithAFlag(output_dir=str(tmp_path), **CPU), GRPOConfig)) is GRPOConfig
    with pytest.raises(ValueError) as refused:
        as_own_config(GRPOConfigWithAFlag(output_dir=str(tmp_path), my_flag=True, **CPU), GRPOConfig)
    message = str(refused.value)
    assert message.startswith(f"my_flag=True is set on the {__name__}.GRPOConfigWithAFlag given as args, and ")
    assert "steadyrl.trainers.grpo.GRPOConfig has no field my_flag" in message
    assert "Leave my_flag at TRL's default (False)" in message
