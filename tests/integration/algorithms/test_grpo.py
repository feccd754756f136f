"""GRPO and the policy-loss family: each loss_type's loss and gradients against TRL's GRPOTrainer, RLOO's against
TRL's RLOOTrainer, the group-relative advantages, the DAPO normaliser, beta=0 without a reference, the vLLM
importance weights and bad input."""

import pytest
import torch
from support.toy_run import make_trainer
from support.trl_parity import (
    BETA,
    GA,
    GENERATION_TOKENS,
    STEPS_PER_GENERATION,
    B,
    assert_same,
    fixed_batch,
    loss_and_gradients,
    scoring_inputs,
    steadyrl_side,
    trl_model,
    trl_trainer,
)

from steadyrl import GRPOConfig, RLOOConfig
from steadyrl.rollout import Rollout


@pytest.mark.parametrize(
    "loss_type",
    ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "sapo/sequence", "luspo", "luspo/sequence", "vespo"],
)
def test_grpo_loss_and_gradients_equal_trl_in_float32(tmp_path, loss_type):
    # "/sequence": GSPO's sequence-level weights (LUSPO's paper setup: each sequence's loss summed over its tokens)
    loss_type, _, level = loss_type.partition("/")
    level = {"importance_sampling_level": level} if level else {}
    trainer = steadyrl_side(tmp_path, "grpo", loss_type=loss_type, beta=BETA, **level)
    tokens = fixed_batch(trainer.processing_class.pad_token_id)
    given = scoring_inputs(trainer, tokens)
    # dapo: TRL divides by (generation tokens / processes) x GA / steps_per_generation; steadyrl by the tokens per
    # micro-batch of the rollout (generation tokens / micro-batches), then by the micro-batches of the step (GA)
    per_micro_batch = torch.full((B,), GENERATION_TOKENS / STEPS_PER_GENERATION)
    batch = Rollout(
        **vars(tokens),
        scores=torch.zeros(B),
        ref_logprobs=given["ref"],
        old_logprobs=given["old"],
        advantages=given["advantages"],
        tokens_per_micro_batch=per_micro_batch,
    )
    ours = loss_and_gradients(trainer.model, lambda: trainer.algorithm.loss(trainer.model, batch)[0] / GA)

    model = trl_model(trainer.model)
    trl_grpo = trl_trainer("grpo", model, tmp_path, loss_type=loss_type, beta=BETA, **level)
    inputs = {
        **vars(tokens),
        "advantages": given["advantages"],
        "old_per_token_logps": given["old"],
        "ref_per_token_logps": given["ref"],
        "num_items_in_batch": torch.tensor(GENERATION_TOKENS),
    }
    assert_same(ours, loss_and_gradients(model, lambda: trl_grpo._compute_loss(model, inputs)))
    clipped = trainer.algorithm.loss(trainer.model, batch)[1]
    if loss_type == "cispo":  # the weight capped at epsilon_high itself (0.28): wherever A > 0
        assert clipped["cispo_clip_ratio"] > 0
    elif loss_type in ("sapo", "vespo"):  # a smooth gate, no clip
        assert not any(name.startswith("clip_ratio") for name in clipped)
    elif not level:  # (a sequence's mean log-ratio stays inside the clip in this batch)
        assert clipped["clip_ratio/low_mean"] > 0 and clipped["clip_ratio/high_mean"] > 0, "both bounds must bind"


@pytest.mark.parametrize("loss_type", ["rloo", "dapo", "cispo", "sapo"])
def test_rloo_loss_and_gradients_equal_trl(tmp_path, loss_type):
    """loss_type='rloo' is TRL's RLOOTrainer loss (one ratio per sequence); RLOO's token-level types are GRPO's
    without the KL term (RLOO's KL is in the reward)."""
    trainer = steadyrl_side(tmp_path, "rloo", loss_type=loss_type, beta=BETA)
    tokens = fixed_batch(trainer.processing_class.pad_token_id)
    given = scoring_inputs(trainer, tokens)
    with torch.no_grad():  # sequence ratios near 1: both sides of the clip and inside it
        old = given["old"] * 0.2 + trainer.rollout_builder.policy_logprobs(trainer.model, tokens) * 0.8
    per_micro_batch = torch.full((B,), GENERATION_TOKENS / STEPS_PER_GENERATION)
    batch = Rollout(
        **vars(tokens),
        scores=torch.zeros(B),
        ref_logprobs=given["ref"],
        old_logprobs=old,
        advantages=given["advantages"],
        tokens_per_micro_batch=per_micro_batch,
    )
    ours = loss_and_gradients(trainer.model, lambda: trainer.algorithm.loss(trainer.model, batch)[0] / GA)
    model = trl_model(trainer.model)
    if loss_type == "rloo":
        trl_rloo = trl_trainer("rloo", model, tmp_path, beta=BETA)
        inputs = {**vars(tokens), "advantages": given["advantages"], "old_logps": (old * tokens.completion_mask).sum(1)}
        theirs = loss_and_gradients(model, lambda: trl_rloo._compute_loss(model, inputs) / GA)  # Trainer divides
    else:
        trl_grpo = trl_trainer("grpo", model, tmp_path, loss_type=loss_type, beta=0.0)
        inputs = {
            **vars(tokens),
            "advantages": given["advantages"],
            "old_per_token_logps": old,
            "num_items_in_batch": torch.tensor(GENERATION_TOKENS),
        }
        theirs = loss_and_gradients(model, lambda: trl_grpo._compute_loss(model, inputs))
    assert_same(ours, theirs)


def test_dapo_normaliser_counts_loss_tokens_of_the_rollout_per_micro_batch(tmp_path):
    trainer = make_trainer(tmp_path, algorithm="grpo", mask_truncated_completions=True)  # 8 samples, 4 micro-batches
    mask = torch.ones(8, 6, dtype=torch.long)
    mask[0, 2:] = 0
    ids = torch.full((8, 6), 5)
    ids[1:, -1] = trainer.processing_class.eos_token_id  # row 0 ends without EOS: masked out of the loss
    rollout = Rollout(
        prompt_ids=ids[:, :2], prompt_mask=mask[:, :2], completion_ids=ids, completion_mask=mask, scores=torch.zeros(8)
    )
    assert trainer.algorithm.tokens_per_micro_batch(rollout).tolist() == [7 * 6 / 4] * 8


def test_beta_zero_makes_no_reference_and_runs_no_reference_pass(tmp_path):
    trainer = make_trainer(tmp_path, algorithm="grpo", beta=0.0, max_steps=2, save_steps=2)
    assert trainer.ref_model is None
    trainer.train()
    assert trainer.training_buffer.buffer.rollout.ref_logprobs is None
    assert "kl" not in trainer.state.log_history[0]
    with_kl = make_trainer(tmp_path / "kl", algorithm="grpo", beta=0.04)
    assert with_kl.ref_model is not None


@pytest.mark.parametrize(
    ("config", "settings", "message"),
    [
        (GRPOConfig, {"loss_type": "cispo", "delta": 2.0}, "delta=2.0 does not apply to loss_type='cispo'"),
        (GRPOConfig, {"loss_type": "gpg"}, "loss_type='gpg' is invalid: use one of grpo, bnpo, dr_grpo, dapo, "),
        (GRPOConfig, {"scale_rewards": "prompt"}, "scale_rewards='prompt' is invalid"),
        (GRPOConfig, {"num_generations": 1}, "num_generations=1 is invalid for GRPO"),
        (GRPOConfig, {"top_entropy_quantile": 1.2}, "top_entropy_quantile=1.2 is invalid"),
        (GRPOConfig, {"off_policy_mask_threshold": -1.0}, "off_policy_mask_threshold=-1.0 is invalid"),
        (GRPOConfig, {"use_adaptive_entropy": True, "entropy_coef_max": -1.0}, "entropy_coef_max=-1.0 are invalid"),
        (GRPOConfig, {"vllm_importance_sampling_correction": True}, "needs use_vllm=True"),
        (GRPOConfig, {"importance_sampling_level": "seq"}, "importance_sampling_level='seq' is invalid"),
        (RLOOConfig, {"loss_type": "rloo", "delta": 2.0}, "delta=2.0 does not apply to loss_type='rloo'"),
        (RLOOConfig, {"loss_type": "grpo_plus"}, "use one of grpo, bnpo, dr_grpo, dapo, rloo"),
    ],
)
def test_bad_policy_loss_settings_are_refused(tmp_path, config, settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(output_dir=str(tmp_path), **settings)


def test_trl_boolean_scale_rewards_and_deprecated_cap_resolve(tmp_path):
    assert GRPOConfig(output_dir=str(tmp_path), scale_rewards=False).scale_rewards == "none"
    assert GRPOConfig(output_dir=str(tmp_path), scale_rewards=True).scale_rewards == "group"
    config = GRPOConfig(output_dir=str(tmp_path), vllm_importance_sampling_cap=2.0)
    assert config.vllm_importance_sampling_clip_max == 2.0
