"""The run fingerprint records every input that changes the math: the reference model, every reward model and its
tokenizer, online DPO's judge, LoRA's settings, the launcher's mixed precision, DeepSpeed's optimizer offload and
optimizer/scheduler sections, and reward functions their name does not identify (partials, lambdas, closures,
callable objects). Secrets are never written to a checkpoint or printed, and changing one does not block a resume."""

from __future__ import annotations

import functools
import json
import os
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT
from support.toy_run import make_config, make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

from integration.rewards.test_reward_model_tokenizer import permuted_tokenizer
from steadyrl import RLOOTrainer
from steadyrl.checkpoint import CheckpointError
from steadyrl.checkpoint.fingerprint import (
    callable_identity,
    judge_identity,
    peft_identity,
)
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

SECRET, OTHER_SECRET = "hf_FirstSecretToken", "hf_SecondSecretToken"


def scaled_letters(completions, letters, scale, **kwargs) -> list[float]:
    return [scale * value for value in letters_reward(completions, letters)]


def prefer(prompts, pairs, index=0) -> list[int]:
    return [index] * len(pairs)


ZEROS = lambda completions, **kwargs: [0.0] * len(completions)  # noqa: E731
ONES = lambda completions, **kwargs: [1.0] * len(completions)  # noqa: E731


# ---- callables --------------------------------------------------------------------------------------------


def test_a_callable_identity_is_the_same_in_every_process(tmp_path, capsys):
    script = tmp_path / "identities.py"
    script.write_text(
        textwrap.dedent("""
        import functools, json
        from steadyrl.checkpoint.fingerprint import callable_identity
        VOWELS = "aeiou"
        def make(scale):
            def reward(completions, **kwargs):
                return [scale * sum(ch in {"a", "e", "i", "o", "u"} for ch in c) for c in completions]
            return reward
        class Judge:
            def __init__(self):
                self.weights = {"b": 2, "a": 1}
                self.letters = frozenset("xyz")
            def judge(self, prompts, pairs):
                return [0] * len(pairs)
        funcs = [lambda completions, **kw: [len([c for c in x if c in VOWELS]) for x in completions],
                 make(0.5), functools.partial(make(2), scale=3), Judge(), Judge().judge]
        print(json.dumps([callable_identity(func) for func in funcs]))
    """)
    )
    runpy.run_path(str(script), run_name="__main__")  # here, under this process's string hash seed
    here = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}  # another process, another seed
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == here
    assert not any("0x" in identity for identity in here), here  # no memory addresses
    assert len(set(here)) == len(here)


def test_a_reward_function_that_cannot_be_recorded_is_named_in_a_warning_at_start(tmp_path, caplog):
    session = object()  # say, an HTTP session: nothing in it can be compared
    make_trainer(tmp_path, reward_funcs=[letters_reward, functools.partial(scaled_letters, scale=1.0, client=session)])
    assert "Cannot record reward_funcs[1].client (builtins.object)" in caplog.text


def test_online_dpo_records_its_judge(tmp_path):
    judge = functools.partial(prefer, index=0)
    trainer = make_trainer(tmp_path, algorithm="online-dpo", reward_funcs=[], judge=judge)
    assert trainer.identity["judge"] == callable_identity(judge)
    assert judge_identity(judge) != judge_identity(functools.partial(prefer, index=1))
    assert judge_identity(None) == {"judge": None}


# ---- LoRA, DeepSpeed ----------------------------------------------------------------------------------------


def test_lora_settings_are_recorded(tmp_path):
    from peft import LoraConfig, get_peft_model

    base = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = make_trainer(tmp_path, peft_config=LoraConfig(**base))
    assert trainer.identity["peft_config.lora_alpha"] == 8 and trainer.identity["ref_model"] == "model without adapters"
    assert trainer.identity["peft_config.target_modules"] == ["q_proj", "v_proj"]

    def identity(**change):
        model = AutoModelForCausalLM.from_pretrained(toy_model_path())
        return peft_identity(get_peft_model(model, LoraConfig(**{**base, **change})))

    reference = identity()
    for field, value in dict(lora_alpha=16, use_rslora=True, lora_dropout=0.1, target_modules=["q_proj"]).items():
        changed = identity(**{field: value})
        assert [key for key in reference if reference[key] != changed[key]] == [f"peft_config.{field}"]
    assert peft_identity(AutoModelForCausalLM.from_pretrained(toy_model_path())) == {}


def test_the_trainer_records_the_deepspeed_config_it_runs_with(tmp_path):
    """A single-process ZeRO-2 trainer (a subprocess: DeepSpeed sets up torch.distributed) is only built, not run."""
    script = textwrap.dedent("""
        import json, sys
        from support.toy_run import make_trainer
        config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}},
                  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
                  "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
        trainer = make_trainer(sys.argv[1], deepspeed=config, use_cpu=True)
        print(json.dumps({k: v for k, v in trainer.identity.items() if k.startswith(("deepspeed.", "zero"))}))
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29500 + os.getpid() % 1000),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert recorded["deepspeed.scheduler"] == {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}
    assert recorded["deepspeed.offload_optimizer"] == "none" and recorded["deepspeed.optimizer"] is None


# ---- secrets ---------------------------------------------------------------------------------------------


def test_a_bad_dtype_error_does_not_print_the_token(tmp_path):
    with pytest.raises(ValueError, match="is not a torch dtype") as error:
        make_trainer(tmp_path, model_init_kwargs={"dtype": "bfloat17", "token": SECRET})
    assert SECRET not in str(error.value)


# ---- resuming one saved run ------------------------------------------------------------------------------


def reward_model(seed: int) -> Qwen2ForSequenceClassification:
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForSequenceClassification(config)


def perturbed_policy():
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    return model


def build(
    output_dir, *, token=SECRET, scale=1.0, last=ZEROS, second_model_seed=1, second_tokenizer="own", ref_model=None
) -> RLOOTrainer:
    """The saved run's trainer: a reward function, a partial, two reward models (the second with its own
    tokenizer) and a lambda; each keyword changes one input."""
    own = permuted_tokenizer(AutoTokenizer.from_pretrained(toy_model_path()))[0]
    tokenizer = own if second_tokenizer == "own" else AutoTokenizer.from_pretrained(toy_model_path())
    funcs = [
        letters_reward,
        functools.partial(scaled_letters, scale=scale),
        reward_model(0),
        reward_model(second_model_seed),
        last,
    ]
    return RLOOTrainer(
        model=toy_model_path(),
        reward_funcs=funcs,
        train_dataset=toy_dataset(),
        args=make_config(output_dir, max_steps=2, save_steps=2, model_init_kwargs={"token": token}),
        reward_processing_classes=[None, None, None, tokenizer, None],
        ref_model=ref_model,
    )


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("fingerprint-run")
    build(output_dir).train()
    return output_dir


def test_unchanged_inputs_resume_with_another_token_and_no_secret_is_written(saved_run, tmp_path):
    trainer = build(tmp_path, token=OTHER_SECRET, ref_model=toy_model_path())  # the given reference is the policy
    trainer.train(resume_from_checkpoint=str(saved_run / "checkpoint-2"))
    assert trainer.state.global_step == 2
    for path in [*saved_run.rglob("*.json"), *tmp_path.rglob("*.json")]:
        assert SECRET not in path.read_text() and OTHER_SECRET not in path.read_text(), path


@pytest.mark.parametrize(
    "change, expected",
    [
        (dict(ref_model=perturbed_policy), r"ref_model: checkpoint 'model', now \{'config'"),
        (dict(second_model_seed=2), r"reward_model\[1\].weights: checkpoint '"),
        (dict(second_tokenizer="policy's"), r"reward_model\[1\].tokenizer: checkpoint '\w+', now None"),
        (dict(scale=2.0), r"reward_funcs\[1\]: checkpoint 'functools.partial\(.*scale=1.0\)', now .*scale=2.0"),
        (dict(last=ONES), r"reward_funcs\[4\]: checkpoint 'integration.resume.test_run_fingerprint.<lambda>\(code="),
        (dict(mixed_precision="bf16"), "mixed_precision: checkpoint 'no', now 'bf16'"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_a_resume_with_another_input_that_changes_the_math_is_refused(
    saved_run, tmp_path, monkeypatch, change, expected
):
    change = {key: value() if key == "ref_model" else value for key, value in change.items()}
    if "mixed_precision" in change:  # as `accelerate launch --mixed_precision bf16` sets it
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", change.pop("mixed_precision"))
    trainer = build(tmp_path, **change)
    with pytest.raises(CheckpointError, match=f"cannot resume from .*checkpoint-2: 1 setting.*{expected}"):
        trainer.train(resume_from_checkpoint=str(saved_run / "checkpoint-2"))
    assert trainer.state.global_step == 0
