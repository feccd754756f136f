"""Helpers of the policy-loss parity tests: one fixed float32 batch fed to steadyrl's trainer and to TRL 1.16's own
GRPOTrainer / RLOOTrainer (installed), whose losses and gradients must agree."""

import torch
from conftest import assert_close_to_scale
from transformers import AutoModelForCausalLM, AutoTokenizer

from steadyrl.rollout import Rollout, TokenBatch
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path
from support.toy_run import make_trainer

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
        logprobs = trainer.rollout_builder.policy_logprobs(trainer.model, tokens)
        reference = AutoModelForCausalLM.from_pretrained(toy_model_path())
        ref_logprobs = trainer.rollout_builder.policy_logprobs(reference, tokens)
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


def parity_inputs(tokens: TokenBatch, given: dict) -> tuple[Rollout, dict]:
    """The fixed batch with ``scoring_inputs``' log-probs and advantages, as steadyrl's ``Rollout`` (the dapo
    normaliser per micro-batch of the rollout) and as TRL's ``_compute_loss`` inputs."""
    batch = Rollout(
        **vars(tokens),
        scores=torch.zeros(B),
        ref_logprobs=given["ref"],
        old_logprobs=given["old"],
        advantages=given["advantages"],
        tokens_per_micro_batch=torch.full((B,), GENERATION_TOKENS / STEPS_PER_GENERATION),
    )
    inputs = {
        **vars(tokens),
        "advantages": given["advantages"],
        "old_per_token_logps": given["old"],
        "ref_per_token_logps": given["ref"],
        "num_items_in_batch": torch.tensor(GENERATION_TOKENS),
    }
    return batch, inputs
