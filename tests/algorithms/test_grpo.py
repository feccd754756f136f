"""GRPO and the policy-loss family: each loss_type's loss and gradients against TRL's GRPOTrainer, RLOO's against
TRL's RLOOTrainer, the group-relative advantages, the DAPO normaliser, beta=0 without a reference, the vLLM
importance weights and bad input."""

import pytest
import torch
from conftest import assert_close_to_scale
from support.toy_run import make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from steadyrl import GRPOConfig, RLOOConfig
from steadyrl.rollout import Rollout, TokenBatch
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

B, PROMPT_LEN, C, MAX_COMPLETION, GA, STEPS_PER_GENERATION = 4, 4, 5, 8, 2, 4
BETA, EPSILON, EPSILON_HIGH = 0.04, 0.2, 0.28
ADVANTAGES = torch.tensor([1.0, -0.5, 0.8, -1.2])
GENERATION_TOKENS = 37  # loss tokens of the whole generation batch (4 micro-batches), for dapo's normaliser


def fixed_batch(pad_token_id: int) -> TokenBatch:
    """B rows of equal-length prompts (TRL passes no position ids, so no left padding) and right-padded completions,
    two of them shorter."""
    generator = torch.Generator().manual_seed(0)
    completion_mask = torch.ones(B, C, dtype=torch.long)
    completion_mask[0, 3:], completion_mask[2, 1:] = 0, 0
    completion_ids = torch.randint(3, 30, (B, C), generator=generator).masked_fill(completion_mask == 0, pad_token_id)
    return TokenBatch(
        prompt_ids=torch.randint(3, 30, (B, PROMPT_LEN), generator=generator),
        prompt_mask=torch.ones(B, PROMPT_LEN, dtype=torch.long),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
    )


def perturbed_policy(model) -> None:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))


def scoring_inputs(trainer, tokens: TokenBatch) -> dict[str, torch.Tensor]:
    """Old log-probs far enough from the policy's that both clip bounds bind, reference log-probs, advantages of
    both signs."""
    with torch.no_grad():
        logprobs = trainer.scoring_passes.policy_logprobs(trainer.model, tokens)
        reference = AutoModelForCausalLM.from_pretrained(toy_model_path())
        ref_logprobs = trainer.scoring_passes.policy_logprobs(reference, tokens)
    shift = torch.tensor([[0.4, -0.4, 0.05, 0.3, -0.3]]).repeat(B, 1)
    return {"old": (logprobs + shift) * tokens.completion_mask, "ref": ref_logprobs, "advantages": ADVANTAGES}


def loss_and_gradients(model, compute) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = compute()
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same(ours, theirs) -> None:
    """Same loss (to 1e-5 of the size of the per-token terms it averages, ~|advantage|) and same gradients (to 1e-5
    of the largest gradient)."""
    (loss, grads), (trl_loss, trl_grads) = ours, theirs
    assert_close_to_scale(loss, trl_loss, scale=ADVANTAGES.abs().max().item(), what="loss")
    assert grads.keys() == trl_grads.keys()
    scale = max(g.abs().max().item() for g in trl_grads.values())
    assert scale > 1e-3, "no gradient to compare"
    for name in grads:
        assert_close_to_scale(grads[name], trl_grads[name], scale=scale, what=name)


def trl_model(policy):
    model = AutoModelForCausalLM.from_pretrained(toy_model_path())
    model.load_state_dict(policy.state_dict())
    return model.train()


def trl_trainer(kind: str, model, tmp_path, **settings):
    """TRL's GRPOTrainer or RLOOTrainer on the toy model, configured like the steadyrl side (GA micro-batches per
    optimizer step, STEPS_PER_GENERATION per generation)."""
    import trl

    config, trainer = (trl.GRPOConfig, trl.GRPOTrainer) if kind == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    args = config(
        output_dir=str(tmp_path / f"trl-{kind}"),
        per_device_train_batch_size=B,
        num_generations=2,
        gradient_accumulation_steps=GA,
        steps_per_generation=STEPS_PER_GENERATION,
        report_to="none",
        max_completion_length=MAX_COMPLETION,
        use_cpu=True,
        bf16=False,
        epsilon=EPSILON,
        epsilon_high=EPSILON_HIGH,
        **settings,
    )
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    built = trainer(
        model,
        reward_funcs=[letters_reward],
        args=args,
        train_dataset=toy_dataset(num_prompts=8),
        processing_class=tokenizer,
    )
    built.current_gradient_accumulation_steps = GA
    return built


def steadyrl_side(tmp_path, algorithm: str, **settings):
    trainer = make_trainer(
        tmp_path / algorithm,
        algorithm=algorithm,
        n_samples_per_prompt=2,
        rollout_batch_size=8,
        micro_train_batch_size=B,
        train_batch_size=B * GA,
        num_ppo_epochs=1,
        max_completion_length=MAX_COMPLETION,
        cliprange=EPSILON,
        cliprange_high=EPSILON_HIGH,
        **settings,
    )
    perturbed_policy(trainer.model)
    trainer.model.train()
    return trainer


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
    ours = loss_and_gradients(trainer.model, lambda: trainer.compute_loss_on_batch(trainer.model, batch)[0] / GA)

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
    clipped = trainer.compute_loss_on_batch(trainer.model, batch)[1]
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
        old = given["old"] * 0.2 + trainer.scoring_passes.policy_logprobs(trainer.model, tokens) * 0.8
    per_micro_batch = torch.full((B,), GENERATION_TOKENS / STEPS_PER_GENERATION)
    batch = Rollout(
        **vars(tokens),
        scores=torch.zeros(B),
        ref_logprobs=given["ref"],
        old_logprobs=old,
        advantages=given["advantages"],
        tokens_per_micro_batch=per_micro_batch,
    )
    ours = loss_and_gradients(trainer.model, lambda: trainer.compute_loss_on_batch(trainer.model, batch)[0] / GA)
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
    assert trainer.tokens_per_micro_batch(rollout).tolist() == [7 * 6 / 4] * 8


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
        (GRPOConfig, {"top_entropy_quantile": 0.2}, "top_entropy_quantile=0.2 is not supported"),
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
