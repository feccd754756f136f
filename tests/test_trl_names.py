"""TRL's argument names on steadyrl's configs: the batch sizes resolve as TRL computes them, contradictions between a
TRL name and steadyrl's are refused, and every field of TRL's RLOO and online-DPO configs is either honoured or refused
(README.md's "Coming from TRL" table lists each; a field TRL adds fails here until it is listed)."""

from __future__ import annotations

import ast
import dataclasses
import itertools
import os
import re
import warnings

import pytest
from conftest import ROOT
from transformers import TrainingArguments

from steadyrl import GRPOConfig, OnlineDPOConfig, PPOConfig, RLOOConfig
from steadyrl.trainers.config.batch_hierarchy import BatchSettings, resolve_batch_hierarchy

SECTION = "## Coming from TRL"


@pytest.fixture(scope="module")
def trl():
    """TRL's config classes: ``{"rloo": trl.RLOOConfig, "grpo": trl.GRPOConfig, "online-dpo":
    trl.experimental.online_dpo.OnlineDPOConfig}``."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's notes on the installed vLLM version
        import trl
        from trl.experimental.online_dpo import OnlineDPOConfig as TRLOnlineDPOConfig
    return {"rloo": trl.RLOOConfig, "grpo": trl.GRPOConfig, "online-dpo": TRLOnlineDPOConfig}


OURS = {"rloo": RLOOConfig, "grpo": GRPOConfig, "online-dpo": OnlineDPOConfig}


def build(config_class, tmp_path, **settings):
    """(config, None), or (None, the ValueError's message). TRL's configs are built in float32 on the CPU."""
    if config_class not in OURS.values() and config_class is not PPOConfig:
        settings = {"bf16": False, **settings}
    try:
        return config_class(output_dir=str(tmp_path), report_to="none", use_cpu=True, **settings), None
    except ValueError as err:
        return None, str(err)


def trl_fields(trl_class) -> list[str]:
    """The fields a TRL config declares beyond ``TrainingArguments``."""
    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    return [f.name for f in dataclasses.fields(trl_class) if f.name not in base]


def readme_table() -> dict[str, str]:
    """``{TRL field: its steadyrl cell}`` from the "TRL field" table of README.md's "Coming from TRL" section."""
    section = (ROOT / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    table = section.split("| TRL field |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        names_cell, steadyrl_cell = line.strip().strip("|").split("|", 1)
        for name in re.findall(r"`(\w+)`", names_cell):
            assert name not in rows, f"{name} appears twice in README's TRL table"
            rows[name] = steadyrl_cell.strip().rstrip("|").strip()
    return rows


# ---- (a) the batch hierarchy TRL's names give ----------------------------------------------------------------------

ROLLOUT_SIZES = [{}, *({"steps_per_generation": s} for s in (1, 4, 6))]
ROLLOUT_SIZES += [{"generation_batch_size": g} for g in (8, 12, 24)]
GRID = [
    dict(per_device_train_batch_size=m, gradient_accumulation_steps=ga, num_generations=k, num_iterations=mu, **rollout)
    for m, ga, k, mu, rollout in itertools.product((1, 2, 4), (1, 2, 4), (2, 3, 4), (1, 2), ROLLOUT_SIZES)
]


def test_rloo_batch_sizes_resolve_as_trl_computes_them(trl, tmp_path):
    """On one process, for every setting of TRL's batch names: what TRL's RLOOConfig derives (generation_batch_size,
    steps_per_generation) equals steadyrl's resolved hierarchy; where TRL refuses, steadyrl does too; and steadyrl
    refuses more only where a rollout would end in the middle of an optimizer step."""
    compared = 0
    for settings in GRID:
        theirs, their_error = build(trl["rloo"], tmp_path, **settings)
        ours, our_error = build(RLOOConfig, tmp_path, **settings)
        if their_error:
            assert our_error, f"{settings}: TRL refuses ({their_error}) but steadyrl accepts"
            continue
        if our_error:
            assert theirs.steps_per_generation % theirs.gradient_accumulation_steps, (settings, our_error)
            assert "are not whole optimizer steps" in our_error, (settings, our_error)
            continue
        world = theirs.world_size
        expected = {
            "micro_train_batch_size": theirs.per_device_train_batch_size,
            "per_device_train_batch_size": theirs.per_device_train_batch_size,
            "gradient_accumulation_steps": theirs.gradient_accumulation_steps,
            "train_batch_size": theirs.per_device_train_batch_size * world * theirs.gradient_accumulation_steps,
            "generation_batch_size": theirs.generation_batch_size,
            "steps_per_generation": theirs.steps_per_generation,
            "rollout_batch_size": theirs.generation_batch_size // theirs.num_generations,
            "n_samples_per_prompt": theirs.num_generations,
            "num_generations": theirs.num_generations,
            "num_ppo_epochs": theirs.num_iterations,
        }
        assert {key: getattr(ours, key) for key in expected} == expected, settings
        optimizer_steps = theirs.steps_per_generation // theirs.gradient_accumulation_steps * theirs.num_iterations
        assert ours.steps_per_rollout == optimizer_steps, settings
        compared += 1
    assert compared > len(GRID) // 3, "the grid should mostly hold settings both accept"


@pytest.mark.parametrize("per_device, accumulation", [(1, 1), (2, 4), (3, 2), (8, 1)])
def test_online_dpo_per_device_batch_counts_prompts_as_in_trl(trl, tmp_path, per_device, accumulation):
    """TRL's online DPO samples a pair for each of per_device_train_batch_size prompts per micro-batch and steps every
    gradient_accumulation_steps micro-batches: one rollout of per_device x processes x accumulation prompts."""
    settings = dict(per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation)
    theirs, _ = build(trl["online-dpo"], tmp_path, **settings)
    ours, error = build(OnlineDPOConfig, tmp_path, **settings)
    assert error is None, error
    prompts_per_step = theirs.per_device_train_batch_size * theirs.world_size * theirs.gradient_accumulation_steps
    assert (ours.rollout_batch_size, ours.train_batch_size) == (prompts_per_step, 2 * prompts_per_step)
    assert ours.micro_train_batch_size == 2 * per_device and ours.steps_per_rollout == 1
    assert (ours.per_device_train_batch_size, ours.gradient_accumulation_steps) == (per_device, accumulation)


def test_other_trl_names_resolve_onto_steadyrls(trl, tmp_path):
    settings = dict(num_iterations=3, epsilon=0.1, epsilon_high=0.28, vllm_max_model_length=4096, num_generations=2)
    theirs, _ = build(trl["rloo"], tmp_path, **settings)
    ours, _ = build(RLOOConfig, tmp_path, **settings)
    assert (ours.num_ppo_epochs, ours.cliprange, ours.cliprange_high, ours.vllm_max_model_len) == (3, 0.1, 0.28, 4096)
    assert all(getattr(ours, name) == getattr(theirs, name) for name in settings)
    assert build(RLOOConfig, tmp_path, epsilon=0.3)[0].cliprange_high == 0.3, "epsilon_high defaults to epsilon"

    lengths = dict(max_new_tokens=32, max_length=200)
    theirs, _ = build(trl["online-dpo"], tmp_path, **lengths)
    ours, _ = build(OnlineDPOConfig, tmp_path, **lengths)
    assert (ours.max_completion_length, ours.max_prompt_length) == (32, 168)
    assert (ours.max_new_tokens, ours.max_length) == (theirs.max_new_tokens, theirs.max_length)


def test_default_hierarchy_is_trls(tmp_path):
    """Nothing set: a micro-batch of 8, no accumulation, one rollout per optimizer step."""
    for config_class, expected in [
        (RLOOConfig, dict(micro_train_batch_size=8, train_batch_size=8, rollout_batch_size=2, n_samples_per_prompt=4)),
        (PPOConfig, dict(micro_train_batch_size=8, train_batch_size=8, rollout_batch_size=2, n_samples_per_prompt=4)),
        (OnlineDPOConfig,
         dict(micro_train_batch_size=16, train_batch_size=16, rollout_batch_size=8, n_samples_per_prompt=2)),
    ]:  # fmt: skip
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


# ---- (b) contradictions -------------------------------------------------------------------------------------------

PER_DEVICE = "per device x 1 process(es)"  # steps_per_generation's term, after "steps_per_generation=S x M completions"
CONTRADICTIONS = [  # config class, settings, the message's start
    (RLOOConfig, dict(num_generations=8, n_samples_per_prompt=4),
     "num_generations=8 contradicts n_samples_per_prompt=4"),
    (RLOOConfig, dict(per_device_train_batch_size=4, micro_train_batch_size=8),
     "per_device_train_batch_size=4 contradicts micro_train_batch_size=8"),
    (OnlineDPOConfig, dict(per_device_train_batch_size=4, micro_train_batch_size=4),
     "per_device_train_batch_size=4 contradicts micro_train_batch_size=4: online DPO's"),
    (RLOOConfig, dict(train_batch_size=16, gradient_accumulation_steps=4, micro_train_batch_size=8),
     "gradient_accumulation_steps=4 contradicts the batch hierarchy, which derives 2 (train_batch_size=16"),
    (RLOOConfig, dict(rollout_batch_size=4, generation_batch_size=32),
     "generation_batch_size=32 contradicts rollout_batch_size=4"),
    (RLOOConfig, dict(rollout_batch_size=4, steps_per_generation=4),
     f"steps_per_generation=4 x 8 completions {PER_DEVICE} = 32 contradicts rollout_batch_size=4"),
    (RLOOConfig, dict(generation_batch_size=16, steps_per_generation=1),
     f"steps_per_generation=1 x 8 completions {PER_DEVICE} = 8 contradicts generation_batch_size=16"),
    (RLOOConfig, dict(num_iterations=2, num_ppo_epochs=1), "num_iterations=2 contradicts num_ppo_epochs=1"),
    (RLOOConfig, dict(epsilon=0.1, cliprange=0.2), "epsilon=0.1 contradicts cliprange=0.2"),
    (RLOOConfig, dict(epsilon_high=0.28, cliprange_high=0.2), "epsilon_high=0.28 contradicts cliprange_high=0.2"),
    (RLOOConfig, dict(vllm_max_model_length=2048, vllm_max_model_len=1024),
     "vllm_max_model_length=2048 contradicts vllm_max_model_len=1024"),
    (OnlineDPOConfig, dict(max_new_tokens=32, max_completion_length=64),
     "max_new_tokens=32 contradicts max_completion_length=64"),
    (OnlineDPOConfig, dict(max_length=300, max_prompt_length=512), "max_length=300 contradicts max_prompt_length=512"),
]  # fmt: skip


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
    same = dict(num_generations=4, n_samples_per_prompt=4, epsilon=0.2, cliprange=0.2, num_iterations=2,
                num_ppo_epochs=2, per_device_train_batch_size=4, micro_train_batch_size=4)  # fmt: skip
    config, error = build(RLOOConfig, tmp_path, **same)
    assert error is None and config.n_samples_per_prompt == 4, error


@pytest.mark.parametrize(
    "config_class, settings, message",
    [
        (RLOOConfig, dict(num_generations=1), r"^num_generations=1 is invalid for RLOO: the leave-one-out baseline"),
        (OnlineDPOConfig, dict(num_generations=4), r"^num_generations=4 is invalid for online DPO.*num_generations=2"),
        (RLOOConfig, dict(generation_batch_size=10),
         r"^The 10 completions of a rollout \(generation_batch_size=10\) are not a multiple of n_samples_per_prompt=4"
         r".* Use a generation_batch_size in 8, 16, 24\.$"),
        (RLOOConfig, dict(per_device_train_batch_size=2, num_generations=4),
         r"^The 2 completions .* not a multiple of num_generations=4.*Use gradient_accumulation_steps=2"),
        (RLOOConfig,
         dict(per_device_train_batch_size=2, gradient_accumulation_steps=4, steps_per_generation=2, num_generations=2),
         r"not whole optimizer steps of 8.*multiple of gradient_accumulation_steps=4, e\.g\. 4, 8, 12\.$"),
        (RLOOConfig, dict(gradient_accumulation_steps=2, generation_batch_size=24),
         r"not whole optimizer steps of 16 .* Use a generation_batch_size in 16, 32, 48\.$"),
        (OnlineDPOConfig, dict(max_length=64), r"^max_length=64 leaves no room for the prompt"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)  # fmt: skip
def test_inexact_trl_batch_sizes_are_refused_in_trls_terms(tmp_path, config_class, settings, message):
    _, error = build(config_class, tmp_path, **settings)
    assert error is not None and re.search(message, error), error


# ---- (c) every TRL field is honoured or refused; defaults ---------------------------------------------------------


def test_every_trl_field_is_in_the_readme_table_and_declared(trl):
    table = readme_table()
    declared_by_trl = set()
    for algorithm, trl_class in trl.items():
        ours = {f.name for f in dataclasses.fields(OURS[algorithm])}
        for name in trl_fields(trl_class):
            declared_by_trl.add(name)
            assert name in table, f"{trl_class.__name__}.{name} is missing from README's '{SECTION}' table"
            assert name in ours, f"{OURS[algorithm].__name__} does not declare TRL's {name}"
            refused = table[name].startswith("not supported")
            unsupported = OURS[algorithm].unsupported_trl_fields
            assert refused == (name in unsupported), f"{name}: README and {algorithm}'s unsupported fields disagree"
    stale = set(table) - declared_by_trl - {"per_device_train_batch_size", "gradient_accumulation_steps"}
    assert not stale, f"README's TRL table lists fields TRL no longer has: {sorted(stale)}"


# TRL's defaults that steadyrl does not share (README.md, "Coming from TRL", says so for each)
DEFAULT_DIFFERENCES = {
    "rloo": {"num_generations": (2, 4), "max_completion_length": (512, 64), "epsilon_high": (None, 0.2)},
    "grpo": {"max_completion_length": (512, 64), "epsilon_high": (None, 0.2),
             "vllm_importance_sampling_correction": (True, False)},
    "online-dpo": {"temperature": (0.9, 1.0), "vllm_gpu_memory_utilization": (0.55, 0.3), "max_length": (512, 576)},
}


@pytest.mark.parametrize("algorithm", sorted(OURS))
def test_defaults_are_trls_except_the_documented_ones(trl, tmp_path, algorithm):
    """Built with no arguments, each TRL field holds TRL's (resolved) default, but for DEFAULT_DIFFERENCES
    (``epsilon_high``: TRL keeps None for "as epsilon"; steadyrl resolves it)."""
    theirs, _ = build(trl[algorithm], tmp_path)
    ours, _ = build(OURS[algorithm], tmp_path)
    differences = {
        name: (getattr(theirs, name), getattr(ours, name))
        for name in trl_fields(trl[algorithm])
        if getattr(theirs, name) != getattr(ours, name)
    }
    assert differences == DEFAULT_DIFFERENCES[algorithm]


# ---- (d) the refused fields -----------------------------------------------------------------------------------------


def refused_rows() -> list[tuple[str, object, str]]:
    """(field, value, message) of each "not supported" row of README's TRL table: the value is read off the message."""
    rows = []
    for name, cell in readme_table().items():
        if cell.startswith("not supported"):
            message = re.search(r"`ValueError: (.+)`", cell).group(1)
            value = re.match(rf"{name}=(.+?) is not supported: ", message).group(1)
            rows.append((name, ast.literal_eval(value), message))
    return rows


@pytest.mark.parametrize("name, value, message", refused_rows(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("config_class", [RLOOConfig, OnlineDPOConfig, PPOConfig, GRPOConfig],
                         ids=lambda c: c.__name__)  # fmt: skip
def test_each_refused_trl_field_says_why(tmp_path, config_class, name, value, message):
    """Each refused row holds for every config that declares the field (GRPO's own ones for GRPO alone)."""
    rules = config_class.unsupported_trl_fields
    if name not in rules:
        assert config_class is not GRPOConfig and name in GRPOConfig.unsupported_trl_fields, name
        return
    _, error = build(config_class, tmp_path, **{name: value})
    assert error == message
    config, error = build(config_class, tmp_path, **{name: rules[name].default})
    assert error is None, error


def test_pad_to_multiple_of_takes_trls_auto_or_none(tmp_path):
    for value in ("auto", None, "none", "null"):  # the strings: from the command line
        config, error = build(RLOOConfig, tmp_path, pad_to_multiple_of=value)
        assert error is None and config.pad_to_multiple_of is None, (value, error)
    assert "pad_to_multiple_of=64 is not supported" in build(RLOOConfig, tmp_path, pad_to_multiple_of="64")[1]


# ---- new fields with TRL's names -----------------------------------------------------------------------------------


def test_dict_fields_take_json_from_the_command_line(tmp_path):
    dicts = dict(model_init_kwargs='{"dtype": "bfloat16"}', generation_kwargs={"suppress_tokens": [0]},
                 chat_template_kwargs='{"enable_thinking": false}')  # fmt: skip
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
)  # fmt: skip
def test_new_fields_are_checked(tmp_path, config_class, settings, message):
    _, error = build(config_class, tmp_path, **settings)
    assert error is not None and re.search(message, error), error


def test_new_fields_keep_their_values(tmp_path):
    settings = dict(min_p=0.05, repetition_penalty=1.1, cache_implementation="static", trust_remote_code=True,
                    disable_dropout=True, shuffle_dataset=False, mask_truncated_completions=True, log_completions=True,
                    num_completions_to_print=3, num_generations_eval=2, log_multimodal=False)  # fmt: skip
    config, _ = build(RLOOConfig, tmp_path, reward_clip_range=[-1, 2], **settings)
    assert {name: getattr(config, name) for name in settings} == settings
    assert config.reward_clip_range == (-1.0, 2.0) and config.remove_unused_columns is False
    assert build(OnlineDPOConfig, tmp_path)[0].disable_dropout is True, "TRL's online DPO default"


def test_a_trl_style_rloo_script_trains(tmp_path):
    """TRL's names only: 2 completions per device, 2 micro-batches per step, 2 steps per rollout, 2 passes."""
    from steadyrl import RLOOTrainer
    from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

    args = RLOOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=4,
        num_generations=2, num_iterations=2, epsilon=0.2, epsilon_high=0.28, max_completion_length=4, max_steps=4,
        learning_rate=1e-3, report_to="none", disable_tqdm=True, save_strategy="no", logging_steps=1,
    )  # fmt: skip
    assert (args.rollout_batch_size, args.train_batch_size, args.steps_per_rollout) == (4, 4, 4)
    trainer = RLOOTrainer(model=toy_model_path(), args=args, train_dataset=toy_dataset(), reward_funcs=[letters_reward])
    trainer.train()
    assert trainer.state.global_step == 4
