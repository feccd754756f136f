"""The rows of docs/errors.md's table ("When input is wrong") in the areas config, trainer and TRL names: a config or
trainer built with a value that is refused. Each row's trigger provokes its error, checked against the table's text
(errors/error_table.py: how, and which file has which areas)."""

from __future__ import annotations

import math

import pytest
from support.toy_run import make_config, make_trainer
from transformers import AutoModelForCausalLM

from integration.errors.error_table import AHEAD, Context, Triggers, rloo
from steadyrl import DistillationTrainer, GRPOConfig, RLOOTrainer
from steadyrl.toy import chat_dataset, toy_dataset, toy_model_path, untrained_chat_model_path

trigger = Triggers(__file__)
config_error = trigger.config_error


# config


@trigger("batch-divides")
def _(ctx):
    make_config(ctx.tmp_path, train_batch_size=3)


@trigger("micro-divides")
def _(ctx):
    make_config(ctx.tmp_path, train_batch_size=4, micro_train_batch_size=3)


@trigger("grad-accum")
def _(ctx):
    make_config(ctx.tmp_path, gradient_accumulation_steps=3)


@trigger("rloo-samples")
def _(ctx):
    make_config(ctx.tmp_path, n_samples_per_prompt=1, train_batch_size=2)


@trigger("dpo-pairs")
def _(ctx):
    make_config(ctx.tmp_path, "online-dpo", n_samples_per_prompt=4)


config_error("max-num-gen-batches", "grpo", dynamic_sampling=True, max_num_gen_batches=-1)


@trigger("trainer-old-order")
def _(ctx):
    RLOOTrainer(toy_model_path(), make_config(ctx.tmp_path), toy_dataset())


@trigger("trainer-quantization")
def _(ctx):
    rloo(ctx, quantization_config={"load_in_4bit": True})


@trigger("vespo-engine-mode")
def _(ctx):
    settings = dict(use_vllm=True, vllm_importance_sampling_correction=True)
    GRPOConfig(
        output_dir=str(ctx.tmp_path), loss_type="vespo", vllm_importance_sampling_mode="sequence_mask", **settings
    )


@trigger("generation-kwargs-reserved")
def _(ctx):
    make_config(ctx.tmp_path, generation_kwargs={"seed": 1})


@trigger("ref-model-unused")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="grpo", beta=0.0, ref_model=toy_model_path())


@trigger("ref-model-is-policy")
def _(ctx):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    make_trainer(ctx.tmp_path, algorithm="online-dpo", model=model, ref_model=model)


config_error("distillation-beta", "distillation", beta=1.5)
config_error("gkd-lmbda", "gkd", lmbda=1.5)
config_error("gkd-loss-type", "gkd", loss_type="dpo")


@trigger("gkd-no-completions")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="gkd", lmbda=0.5)  # the toy chat prompts: no completion column


@trigger("gkd-seq-kd-split")
def _(ctx):
    from steadyrl.trainers.gkd import check_teacher_generates

    check_teacher_generates(make_config(ctx.tmp_path, "gkd", seq_kd=True, lmbda=0.5), zero3=True, fsdp_version=None)


@trigger("distillation-no-teacher")
def _(ctx):
    DistillationTrainer(untrained_chat_model_path(), args=make_config(ctx.tmp_path, "distillation"))


@trigger("teacher-is-student")
def _(ctx):
    model = AutoModelForCausalLM.from_pretrained(untrained_chat_model_path())
    DistillationTrainer(model, model, make_config(ctx.tmp_path, "distillation"), chat_dataset("train"))


@trigger("ppo-num-mini-batches")
def _(ctx):
    make_config(ctx.tmp_path, "ppo", num_mini_batches=4)


@trigger("grpo-samples")
def _(ctx):
    GRPOConfig(output_dir=str(ctx.tmp_path), num_generations=1)


@trigger("grpo-scale-rewards")
def _(ctx):
    GRPOConfig(output_dir=str(ctx.tmp_path), scale_rewards="prompt")


@trigger("loss-type")
def _(ctx):
    GRPOConfig(output_dir=str(ctx.tmp_path), loss_type="gpg")


config_error("top-entropy-quantile", "grpo", top_entropy_quantile=1.2)
config_error("structured-outputs-vllm", vllm_structured_outputs_regex="[0-9]+")


@trigger("router-aux-loss-dense")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="grpo", router_aux_loss_coef=0.01)


config_error("off-policy-mask-threshold", "grpo", off_policy_mask_threshold=-0.5)
config_error("reinforce-pp-estimator", "reinforce-pp", advantage_estimator="gae")
config_error("reinforce-pp-loss-type", "reinforce-pp", loss_type="vespo")
config_error("reinforce-pp-kl-estimator", "reinforce-pp", kl_estimator="k4")
config_error("reinforce-pp-gamma", "reinforce-pp", gamma=0.0)
config_error("reinforce-pp-baseline-gamma", "reinforce-pp", advantage_estimator="reinforce_baseline", gamma=0.9)
config_error(
    "reinforce-pp-baseline-samples",
    "reinforce-pp",
    advantage_estimator="reinforce_baseline",
    n_samples_per_prompt=1,
    train_batch_size=2,
    micro_rollout_batch_size=4,
)
config_error("reinforce-pp-init-kl-coef", "reinforce-pp", init_kl_coef=0.1, beta=0.2)
config_error("reinforce-pp-clip-range", "reinforce-pp", reward_clip_range=[1.0, -1.0])
config_error("nonfinite-limit", max_consecutive_nonfinite_steps=-1)
config_error("adaptive-entropy-bounds", "grpo", use_adaptive_entropy=True, entropy_coef_min=0.5, entropy_coef_max=0.1)


@trigger("rloo-sequence-loss")
def _(ctx):
    make_config(ctx.tmp_path, loss_type="rloo", importance_sampling_level="sequence")


@trigger("vllm-is-correction")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", vllm_importance_sampling_correction=True)


@trigger("vllm-is-bounds")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", vllm_importance_sampling_clip_min=2.0, vllm_importance_sampling_clip_max=1.5)


@trigger("staleness-invalid")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", max_staleness=-1)


@trigger("partial-invalid")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", **AHEAD, max_staleness=1, partial_rollout_tokens=-1)


@trigger("partial-staleness")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", **AHEAD, partial_rollout_tokens=4)


@trigger("partial-length")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", **AHEAD, max_staleness=1, partial_rollout_tokens=8, max_completion_length=8)


@trigger("staleness-server")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", use_vllm=True, max_staleness=1)


@trigger("staleness-correction")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", **{**AHEAD, "vllm_importance_sampling_correction": False}, max_staleness=1)


@trigger("staleness-algorithm")
def _(ctx):
    make_config(ctx.tmp_path, "ppo", use_vllm=True, vllm_mode="server", max_staleness=1)


@trigger("sync-ref-no-reference")
def _(ctx):
    make_trainer(ctx.tmp_path, algorithm="grpo", beta=0.0, sync_ref_model=True)


@trigger("grpo-normalize-eos")
def _(ctx):
    make_config(ctx.tmp_path, "grpo", multi_objective_aggregation="normalize_then_sum", missing_eos_penalty=0.1)


@trigger("ppo-gamma")
def _(ctx):
    make_config(ctx.tmp_path, "ppo", gamma=1.5)


@trigger("learning-rate")
def _(ctx):
    make_config(ctx.tmp_path, learning_rate=math.nan)


@trigger("lr-scheduler")
def _(ctx):
    make_config(ctx.tmp_path, lr_scheduler_type="cosin")


@trigger("warmup-steps")
def _(ctx):
    make_config(ctx.tmp_path, warmup_steps=-1)


@trigger("save-strategy")
def _(ctx):
    make_config(ctx.tmp_path, save_strategy="epoch")


@trigger("save-steps")
def _(ctx):
    make_config(ctx.tmp_path, save_steps=0)


@trigger("save-on-each-node")
def _(ctx):
    make_config(ctx.tmp_path, save_on_each_node=True)


@trigger("seed")
def _(ctx):
    make_config(ctx.tmp_path, seed=-1)


@trigger("missing-eos")
def _(ctx):
    make_config(ctx.tmp_path, missing_eos_penalty=-1.0)


@trigger("eval-strategy")
def _(ctx):
    make_config(ctx.tmp_path, eval_strategy="epoch")


@trigger("sync-ref-alpha")
def _(ctx):
    make_config(ctx.tmp_path, ref_model_mixup_alpha=1.5)


@trigger("sync-ref-steps")
def _(ctx):
    make_config(ctx.tmp_path, ref_model_sync_steps=0)


# TRL names: a config built with TRL's argument names. make_config's toy settings use steadyrl's names, so a TRL name
# there contradicts them; UNSET_BATCH leaves the batch sizes to TRL's names alone.

UNSET_BATCH = dict(rollout_batch_size=None, train_batch_size=None, micro_train_batch_size=None)


config_error("trl-num-generations", num_generations=4)
config_error("trl-per-device", per_device_train_batch_size=4)
config_error("trl-per-device-dpo", "online-dpo", per_device_train_batch_size=2)
config_error("trl-generation-batch", generation_batch_size=16)
config_error("trl-steps-per-generation", steps_per_generation=2)
config_error("trl-generation-and-steps", **UNSET_BATCH, generation_batch_size=16, steps_per_generation=1)
config_error("trl-num-iterations", num_iterations=1)
config_error("trl-epsilon", cliprange=0.2, epsilon=0.1)
config_error("trl-epsilon-high", cliprange_high=0.3, epsilon_high=0.28)
config_error("trl-vllm-max-model-length", vllm_max_model_len=1024, vllm_max_model_length=2048)
config_error("trl-max-new-tokens", "online-dpo", max_new_tokens=16)
config_error("trl-max-length", "online-dpo", max_prompt_length=512, max_length=100)
config_error("trl-max-length-short", "online-dpo", max_length=8)
config_error("trl-whole-groups", **UNSET_BATCH, generation_batch_size=5)
config_error(
    "trl-whole-steps",
    **UNSET_BATCH,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    steps_per_generation=3,
)

# TRL fields for what steadyrl does not do, each set to something else than TRL's default
UNSUPPORTED_VALUES = {
    "vllm_model_impl": "transformers",
    "use_transformers_continuous_batching": True,
    "transformers_continuous_batching_config": {"max_batch_tokens": 512},
    "use_transformers_paged": True,
}
for name, value in UNSUPPORTED_VALUES.items():
    config_error(f"trl-{name.replace('_', '-')}", **{name: value})
# TRL's SFT fields on GKDConfig
GKD_UNSUPPORTED_VALUES = {
    "padding_free": True,
    "chat_template_path": "template.jinja",
    "eos_token": "</s>",
    "activation_offloading": True,
}
for name, value in GKD_UNSUPPORTED_VALUES.items():
    config_error(f"trl-{name.replace('_', '-')}", "gkd", **{name: value})
config_error("pad-to-multiple-of", pad_to_multiple_of=0)
config_error("log-completions-hub-repo", "grpo", log_completions_hub_repo="me/completions")
config_error("log-completions-hub-repo-id", "grpo", log_completions=True, log_completions_hub_repo="a/b/c")


@trigger("reward-timeout")
def _(ctx):
    make_config(ctx.tmp_path, reward_timeout=0)


config_error("vllm-lora-sync", use_vllm=True, vllm_lora_sync="always")
config_error("generation-backend-unregistered", generation_backend="tpu")
config_error("generation-backend-use-vllm", generation_backend="hf", use_vllm=True)
config_error("generation-backend-vllm-mode", generation_backend="vllm_server", vllm_mode="colocate")


@trigger("max-steps-zero")
def _(ctx):
    make_config(ctx.tmp_path, max_steps=0)


@trigger("epochs-zero")
def _(ctx):
    make_config(ctx.tmp_path, max_steps=-1, num_train_epochs=0)


@pytest.mark.parametrize("row_id", trigger.row_ids())
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    trigger.check(row_id, Context(tmp_path, request, monkeypatch, capsys))
