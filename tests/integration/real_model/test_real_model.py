"""Every trainer on a real pretrained chat model: SmolLM2-135M-Instruct (steadyrl.real: 134.5M parameters, a 49,152 x
576 embedding, past 2**24 elements) on the arithmetic task, with HF generate and with vLLM; LoRA.

Two optimizer steps each, with rewards that differ within every group (so the steps move the weights). GRPO with HF
generate is test_real_model_runs.py's one uninterrupted run, which that module also exports, resumes after a kill and
compares; the two-process ZeRO-2 run is there too."""

import pytest
import torch
from support.toy_run import shorter_is_better

from steadyrl import ALGORITHMS
from steadyrl.real import answer_format, arithmetic_dataset, correct_answer, smollm2_path

SMALL = dict(
    rollout_batch_size=2,
    n_samples_per_prompt=2,
    micro_rollout_batch_size=4,
    train_batch_size=4,
    micro_train_batch_size=2,
    num_ppo_epochs=1,
    max_completion_length=8,
    learning_rate=1e-5,
    beta=0.04,
    max_steps=2,
    save_strategy="no",
    logging_steps=1,
    report_to="none",
    disable_tqdm=True,
    seed=0,
)
VLLM = dict(use_vllm=True, vllm_dtype="float32")
SAMPLED_WEIGHT = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_path()


def real_trainer(output_dir, algorithm: str, model: str, seen: list, peft_config=None, **overrides):
    def recording_correct_answer(prompts, completions, answer, **kwargs):
        seen.append((prompts, completions))
        return correct_answer(completions, answer)

    config_class, trainer_class = ALGORITHMS[algorithm]
    args = config_class(output_dir=str(output_dir), **{**SMALL, **overrides})
    return trainer_class(
        model,
        args=args,
        train_dataset=arithmetic_dataset(size=16),
        peft_config=peft_config,
        reward_funcs=[recording_correct_answer, answer_format, shorter_is_better],
    )


def assert_trained(trainer, before: torch.Tensor, seen: list, vllm: bool) -> None:
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert trainer.state.global_step == 2 and len(logs) == 2, trainer.state.log_history
    assert all(entry["grad_norm"] > 0 for entry in logs), logs
    assert not torch.equal(before, trainer.model.get_parameter(SAMPLED_WEIGHT).detach()), "the weights did not move"
    prompts, completions = seen[0]
    assert all(p[-1]["role"] == "user" and p[-1]["content"].startswith("What is") for p in prompts)
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in completions)
    if vllm:  # the engine samples with the trainer's weights: their log-probs of the sampled tokens agree
        assert all(entry["generation_logprob_diff"] < 1e-3 for entry in logs), logs


@pytest.mark.parametrize("use_vllm", [False, True], ids=["hf", "vllm"])
@pytest.mark.parametrize("algorithm", ["rloo", "ppo", "online-dpo"])
def test_every_trainer_trains_the_real_model(tmp_path, smollm2, algorithm, use_vllm):
    """PPO's critic starts from the policy's backbone; online DPO ranks each pair by the rewards."""
    seen = []
    trainer = real_trainer(tmp_path, algorithm, smollm2, seen, **(VLLM if use_vllm else {}))
    before = trainer.model.get_parameter(SAMPLED_WEIGHT).detach().clone()
    trainer.train()
    assert_trained(trainer, before, seen, use_vllm)


def test_grpo_trains_the_real_model_with_vllm(tmp_path, smollm2):
    """GRPO with TRL's names, sampling with vLLM (with HF generate: test_real_model_runs.py)."""
    seen = []
    trainer = real_trainer(tmp_path, "grpo", smollm2, seen, num_generations=2, loss_type="dapo", **VLLM)
    before = trainer.model.get_parameter(SAMPLED_WEIGHT).detach().clone()
    trainer.train()
    assert_trained(trainer, before, seen, vllm=True)


def test_lora_on_the_real_model_syncs_merged_weights_to_vllm(tmp_path, smollm2):
    """RLOO trains LoRA adapters; vLLM samples with the merged weights, so its log-probs match the adapted policy's."""
    from peft import LoraConfig

    seen = []
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    trainer = real_trainer(tmp_path, "rloo", smollm2, seen, peft_config=lora, learning_rate=1e-3, **VLLM)
    adapter = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    before = trainer.model.get_parameter(adapter).detach().clone()
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert trainer.state.global_step == 2 and all(entry["grad_norm"] > 0 for entry in logs), logs
    assert not torch.equal(before, trainer.model.get_parameter(adapter).detach()), "the adapters did not move"
    assert logs[1]["generation_logprob_diff"] < 1e-3, "vLLM did not sample with the adapted weights"
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    assert trainable < 0.01 * sum(p.numel() for p in trainer.model.parameters()), "only the adapters train"
