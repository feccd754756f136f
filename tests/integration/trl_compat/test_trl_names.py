"""TRL's argument names on steadyrl's configs, against TRL's own: the batch sizes resolve as TRL computes them, and
every field of TRL's RLOO, GRPO, online-DPO, distillation and GKD configs is honoured, refused or (as in TRL) without
effect (the "Every TRL field" table of docs/coming-from-trl.md lists each; a field TRL adds fails here until it is
listed). Contradictions and value checks without TRL: unit/trainers/config/test_config_resolution.py."""

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

from steadyrl import DistillationConfig, GKDConfig, GRPOConfig, OnlineDPOConfig, PPOConfig, RLOOConfig

SECTION = "## Every TRL field"
TABLE_PAGE = ROOT / "docs" / "coming-from-trl.md"


@pytest.fixture(scope="module")
def trl():
    """TRL's config classes: ``{"rloo": trl.RLOOConfig, "grpo": trl.GRPOConfig, "online-dpo":
    trl.experimental.online_dpo.OnlineDPOConfig, "distillation": trl.DistillationConfig, "gkd":
    trl.experimental.gkd.GKDConfig}``."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's notes on the installed vLLM version
        import trl
        from trl.experimental.gkd import GKDConfig as TRLGKDConfig
        from trl.experimental.online_dpo import OnlineDPOConfig as TRLOnlineDPOConfig
    return {
        "rloo": trl.RLOOConfig,
        "grpo": trl.GRPOConfig,
        "online-dpo": TRLOnlineDPOConfig,
        "distillation": trl.DistillationConfig,
        "gkd": TRLGKDConfig,
    }


OURS = {
    "rloo": RLOOConfig,
    "grpo": GRPOConfig,
    "online-dpo": OnlineDPOConfig,
    "distillation": DistillationConfig,
    "gkd": GKDConfig,
}


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
    """``{TRL field: its steadyrl cell}`` from the "TRL field" table of docs/coming-from-trl.md."""
    section = TABLE_PAGE.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    table = section.split("| TRL field |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        names_cell, steadyrl_cell = line.strip().strip("|").split("|", 1)
        for name in re.findall(r"`(\w+)`", names_cell):
            assert name not in rows, f"{name} appears twice in the docs' TRL table"
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


# ---- (b) every TRL field is honoured or refused; defaults ---------------------------------------------------------


def test_every_trl_field_is_in_the_readme_table_and_declared(trl):
    table = readme_table()
    declared_by_trl = set()
    for algorithm, trl_class in trl.items():
        ours = {f.name for f in dataclasses.fields(OURS[algorithm])}
        for name in trl_fields(trl_class):
            declared_by_trl.add(name)
            assert name in table, f"{trl_class.__name__}.{name} is missing from the docs' '{SECTION}' table"
            assert name in ours, f"{OURS[algorithm].__name__} does not declare TRL's {name}"
            refused = table[name].startswith("not supported")
            unsupported = OURS[algorithm].unsupported_trl_fields
            assert refused == (name in unsupported), f"{name}: the docs and {algorithm}'s unsupported fields disagree"
    stale = set(table) - declared_by_trl - {"per_device_train_batch_size", "gradient_accumulation_steps"}
    assert not stale, f"the docs' TRL table lists fields TRL no longer has: {sorted(stale)}"


# TRL's defaults that steadyrl does not share (docs/coming-from-trl.md says so for each)
DEFAULT_DIFFERENCES = {
    "rloo": {"num_generations": (2, 4), "max_completion_length": (512, 64), "epsilon_high": (None, 0.2)},
    "grpo": {
        "max_completion_length": (512, 64),
        "epsilon_high": (None, 0.2),
        "vllm_importance_sampling_correction": (True, False),
    },
    "online-dpo": {"temperature": (0.9, 1.0), "max_length": (512, 576)},
    "distillation": {},
    # SFT's dataset packing is steadyrl's packed passes (the same numbers); TRL's GKDTrainer ignores shuffle_dataset
    "gkd": {"packing": (False, True), "shuffle_dataset": (False, True)},
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


# ---- (c) the refused fields -----------------------------------------------------------------------------------------


def refused_rows() -> list[tuple[str, object, str]]:
    """(field, value, message) of each "not supported" row of the docs' TRL table: the value is read off the message."""
    rows = []
    for name, cell in readme_table().items():
        if cell.startswith("not supported"):
            message = re.search(r"`ValueError: (.+)`", cell).group(1)
            value = re.match(rf"{name}=(.+?) is not supported: ", message).group(1)
            rows.append((name, ast.literal_eval(value), message))
    return rows


REFUSING_CONFIGS = [RLOOConfig, OnlineDPOConfig, PPOConfig, GRPOConfig, GKDConfig]


@pytest.mark.parametrize("name, value, message", refused_rows(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("config_class", REFUSING_CONFIGS, ids=lambda c: c.__name__)
def test_each_refused_trl_field_says_why(tmp_path, config_class, name, value, message):
    """Each refused row holds for every config that refuses the field (GKD's SFT fields for GKD alone)."""
    rules = config_class.unsupported_trl_fields
    if name not in rules:
        assert any(name in other.unsupported_trl_fields for other in REFUSING_CONFIGS), name
        return
    _, error = build(config_class, tmp_path, **{name: value})
    assert error == message
    config, error = build(config_class, tmp_path, **{name: rules[name].default})
    assert error is None, error


# ---- a script in TRL's names ----------------------------------------------------------------------------------------


def test_a_trl_style_rloo_script_trains(tmp_path):
    """TRL's names only: 2 completions per device, 2 micro-batches per step, 2 steps per rollout, 2 passes."""
    from steadyrl import RLOOTrainer
    from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

    args = RLOOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        num_generations=2,
        num_iterations=2,
        epsilon=0.2,
        epsilon_high=0.28,
        max_completion_length=4,
        max_steps=4,
        learning_rate=1e-3,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
    )
    assert (args.rollout_batch_size, args.train_batch_size, args.steps_per_rollout) == (4, 4, 4)
    trainer = RLOOTrainer(model=toy_model_path(), args=args, train_dataset=toy_dataset(), reward_funcs=[letters_reward])
    trainer.train()
    assert trainer.state.global_step == 4
