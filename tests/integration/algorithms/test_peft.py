"""PEFT: the reference is the base model with adapters disabled; checkpoints hold the adapter; resume is exact."""

import pytest
import torch
from peft import LoraConfig
from support.toy_run import DATASETS, make_config

from steadyrl import ALGORITHMS
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

# Constant LR: the run is split by stopping at max_steps=2, and a linear schedule depends on max_steps.
PEFT_RUN = dict(max_steps=4, save_steps=2, max_completion_length=6, lr_scheduler_type="constant", warmup_steps=0)


@pytest.fixture(params=["rloo", "ppo", "online-dpo", "reinforce-pp"])
def algorithm(request):
    return request.param


def lora_trainer(output_dir, algorithm, **overrides):
    return ALGORITHMS[algorithm].trainer_class(
        model=toy_model_path(),
        args=make_config(output_dir, algorithm, **{**PEFT_RUN, **overrides}),
        train_dataset=toy_dataset(**DATASETS.get(algorithm, {})),
        reward_funcs=[letters_reward],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )


def adapter_state(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}


def test_lora_run_resumes_exactly_and_checkpoints_the_adapter(tmp_path, algorithm):
    full = lora_trainer(tmp_path / "full", algorithm)
    assert full.ref_model is None
    full.train()
    actor_dir = tmp_path / "full" / "checkpoint-4"  # the adapter at the top level, as Trainer's PEFT checkpoint
    assert (actor_dir / "adapter_model.safetensors").is_file() and not (actor_dir / "model.safetensors").exists()

    first = lora_trainer(tmp_path / "resumed", algorithm, max_steps=2)
    first.train()
    resumed = lora_trainer(tmp_path / "resumed", algorithm)
    resumed.train(resume_from_checkpoint=True)
    expected, actual = adapter_state(full), adapter_state(resumed)
    assert expected.keys() == actual.keys() and expected
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


def test_reference_logprobs_come_from_the_base_model(tmp_path, algorithm):
    from transformers import AutoModelForCausalLM

    from steadyrl.ops import batched_logprobs, pad_prompts_and_completions
    from steadyrl.rollout import TokenBatch

    trainer = lora_trainer(tmp_path, algorithm)
    plain = AutoModelForCausalLM.from_pretrained(toy_model_path())
    tokens = TokenBatch(**pad_prompts_and_completions([[3, 4, 40]], [[5, 6, 1]], trainer.processing_class.pad_token_id))
    temperature = trainer.algorithm.logprob_temperature
    with torch.no_grad():
        ref = trainer.rollout_builder.reference_logprobs(tokens)
        expected = batched_logprobs(plain, tokens.token_tensors, temperature, batch_size=8)
        adapted = batched_logprobs(trainer.model, tokens.token_tensors, temperature, batch_size=8)
    torch.testing.assert_close(ref, expected)
    assert not torch.allclose(adapted, expected), "the LoRA adapter (non-zero init) changes the policy"


def test_ppo_critic_starts_from_the_base_weights_without_the_adapter(tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = lora_trainer(tmp_path, "ppo")
    base = AutoModelForCausalLM.from_pretrained(toy_model_path()).model
    critic_backbone = trainer.critic.model.model
    for name, param in base.named_parameters():
        assert torch.equal(param, critic_backbone.get_parameter(name)), name
    assert not any("lora_" in name for name, _ in critic_backbone.named_parameters())
