"""GRPO's token selection, entropy bonus and float32 LM head (TRL 1.16's top_entropy_quantile,
off_policy_mask_threshold, entropy_coef, use_adaptive_entropy, cast_lm_head_to_fp32): loss and gradients against
TRL's own GRPOTrainer on the same batch, the adaptive coefficient's update, its checkpointing, and a training run
that uses them all."""

import json

import pytest
import torch
from support.tolerances import (
    assert_gradients_within,
    assert_within,
    decoder_bound,
    gradient_scale,
    logit_scale,
    relative_bound,
)
from support.toy_run import make_trainer
from support.trl_parity import (
    ADVANTAGES,
    BETA,
    GA,
    PROMPT_LEN,
    B,
    C,
    assert_same,
    fixed_batch,
    loss_and_gradients,
    parity_inputs,
    scoring_inputs,
    steadyrl_side,
    trl_model,
    trl_trainer,
)
from transformers import AutoModelForCausalLM

from steadyrl.ops.token_selection import high_entropy_mask, off_policy_mask
from steadyrl.toy import toy_model_path

# the fixed batch's old log-probs are the policy's shifted by [0.4, -0.4, 0.05, 0.3, -0.3] per token: a sequence's
# mean log(pi_old / pi) is 0.4 for the one-token row and 0.01-0.017 for the others; 0.005 drops the two with A < 0
OFF_POLICY = 0.005
CASES = {
    "entropy-mask": dict(loss_type="grpo", top_entropy_quantile=0.5),
    "entropy-mask/dapo": dict(loss_type="dapo", top_entropy_quantile=0.3),
    "off-policy": dict(loss_type="grpo", off_policy_mask_threshold=OFF_POLICY),
    "off-policy/dr_grpo": dict(loss_type="dr_grpo", off_policy_mask_threshold=OFF_POLICY, top_entropy_quantile=0.6),
    "entropy-bonus": dict(loss_type="dapo", entropy_coef=0.05),
    "entropy-bonus/masked": dict(loss_type="bnpo", entropy_coef=0.05, top_entropy_quantile=0.5),
    "adaptive": dict(loss_type="grpo", entropy_coef=0.1, use_adaptive_entropy=True, entropy_target=50.0),
}


def both_sides(tmp_path, settings: dict):
    """steadyrl's GRPO and TRL's on the fixed batch, with ``settings``; each side's (loss, gradients) computation."""
    trainer = steadyrl_side(tmp_path, "grpo", beta=BETA, **settings)
    tokens = fixed_batch(trainer.processing_class.pad_token_id)
    given = scoring_inputs(trainer, tokens)
    batch, inputs = parity_inputs(tokens, given)
    model = trl_model(trainer.model)
    trl_grpo = trl_trainer("grpo", model, tmp_path, beta=BETA, **settings)
    ours = (trainer, lambda: trainer.algorithm.loss(trainer.model, batch)[0] / GA)
    theirs = (model, trl_grpo, lambda: trl_grpo._compute_loss(model, inputs))
    return ours, theirs, batch


@pytest.mark.parametrize("case", list(CASES))
def test_token_selection_and_entropy_bonus_equal_trl(tmp_path, case):
    settings = CASES[case]
    (trainer, ours), (model, trl_grpo, theirs), batch = both_sides(tmp_path, settings)
    if settings.get("use_adaptive_entropy"):  # applied once the last step's entropy is at or below the target
        trainer.algorithm.state.last_entropy, trl_grpo._last_world_entropy = 1.0, 1.0
    assert_same(loss_and_gradients(trainer.model, ours), loss_and_gradients(model, theirs))
    if "entropy_coef" in settings:  # the bonus changes the loss: without it the two would differ
        assert trainer.algorithm.loss(trainer.model, batch)[1]["policy_loss"] != 0


def test_masks_drop_what_they_should(tmp_path):
    """On the fixed batch: off-policy masking drops exactly the negative-advantage sequences above the threshold; the
    entropy mask keeps the top share of loss tokens (ties kept)."""
    mask = fixed_batch(0).completion_mask
    logprobs = torch.zeros(mask.shape)
    sampled = torch.tensor([[0.4, -0.4, 0.05, 0.3, -0.3]]).repeat(B, 1)
    kept = off_policy_mask(ADVANTAGES, logprobs, sampled, mask, OFF_POLICY).squeeze(1)
    assert kept.tolist() == [1, 0, 1, 0]  # A = [1.0, -0.5, 0.8, -1.2]
    entropy = torch.arange(mask.numel(), dtype=torch.float32).view(mask.shape)
    high = high_entropy_mask(entropy, mask, 0.75, entropy[mask.bool()])
    assert high.sum().item() == 4 and (high <= mask.bool()).all()
    assert entropy[high].min() >= entropy[mask.bool() & ~high].max()


def test_adaptive_coefficient_updates_as_trl_and_is_checkpointed(tmp_path):
    """One optimizer step's window (one micro-batch here): TRL updates entropy_coef from the window's mean entropy;
    steadyrl's coefficient after the step equals it, and it is in the checkpoint a resume reads."""
    settings = dict(loss_type="grpo", entropy_coef=0.1, use_adaptive_entropy=True, entropy_target=50.0)
    settings["entropy_coef_delta"] = 0.03
    (trainer, ours), (model, trl_grpo, theirs), _ = both_sides(tmp_path, settings)
    trainer.algorithm.begin_step(0)
    ours()
    trainer.algorithm.end_step(refused={})
    theirs()  # outside an accumulation context: the step's boundary, where TRL updates
    state = trainer.algorithm.state
    assert state.coef == pytest.approx(trl_grpo.entropy_coef, abs=1e-12) and state.coef == pytest.approx(0.13)
    assert state.last_entropy == pytest.approx(trl_grpo._last_world_entropy, rel=1e-6)


def test_grpo_trains_with_every_option_and_resumes_exactly(tmp_path):
    """Entropy masking, off-policy masking and an adaptive entropy bonus in a real run of 4 steps (2 per rollout,
    so old log-probs differ from the policy's): the coefficient moves, is logged, and a run resumed from step 2 ends
    with the uninterrupted run's weights and coefficient."""
    settings = dict(
        top_entropy_quantile=0.5,
        off_policy_mask_threshold=0.01,
        entropy_coef=0.01,
        use_adaptive_entropy=True,
        entropy_target=100.0,  # above the toy model's entropy: the coefficient rises by delta each step
        entropy_coef_delta=0.002,
        num_ppo_epochs=2,
        max_steps=4,
        save_steps=2,
    )
    full = make_trainer(tmp_path / "full", algorithm="grpo", **settings)
    full.train()
    logged = [entry["entropy_coef"] for entry in full.state.log_history if "entropy_coef" in entry]
    assert logged == pytest.approx([0.012, 0.014, 0.016, 0.018])
    state = json.loads((tmp_path / "full" / "checkpoint-2" / "steadyrl_state.json").read_text())
    assert json.dumps(state).count('"entropy_coef": 0.014') == 1, "the coefficient after step 2 is checkpointed"

    cut = make_trainer(tmp_path / "cut", algorithm="grpo", **{**settings, "max_steps": 2})
    cut.train()
    resumed = make_trainer(tmp_path / "cut", algorithm="grpo", **settings)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.algorithm.state.coef == full.algorithm.state.coef
    for (name, ours), theirs in zip(resumed.model.state_dict().items(), full.model.state_dict().values()):
        assert torch.equal(ours, theirs), name


def assert_same_up_to_rounding(ours, theirs, model, tokens, entropy_coef: float) -> None:
    """steadyrl's and TRL's (loss, gradients) on a bfloat16 model with a float32 head. Both run the same bfloat16
    layers on the same padded batch; their heads differ (steadyrl's chunked, TRL's whole), in float32. So what only
    the head computes is held to float32's bound: the loss, and the tied embedding's rows of tokens that are no
    input, whose gradient only the head gives. The other gradients pass through the layers' backward in bfloat16,
    which promises little over four layers (~half the largest gradient): they are held to that bound, and only a
    missing or far-off gradient fails there (an entropy bonus with no gradient moves them by ~1% of the largest, and
    the head-only rows by 0.2%, over 100 times their bound)."""
    (loss, grads), (trl_loss, trl_grads) = ours, theirs
    config, positions = model.config, B * (PROMPT_LEN + C)
    # the head's sums over the hidden size and the vocabulary, the loss's and the weight gradient's over positions
    head = relative_bound(2 * (config.hidden_size + config.vocab_size + positions))
    # a loss token's terms per unit of log-prob: the advantage times a ratio near 1, the KL's and the bonus's weights
    per_token = ADVANTAGES.abs().max().item() + BETA + entropy_coef
    assert_within(loss, trl_loss, head * logit_scale(model, *vars(tokens).values()) * per_token, what="loss")
    head_only = torch.ones(config.vocab_size, dtype=torch.bool)
    head_only[torch.cat([tokens.prompt_ids.flatten(), tokens.completion_ids.flatten()])] = False
    name = "model.embed_tokens.weight"
    bound = head * gradient_scale(trl_grads)
    assert_within(grads[name][head_only], trl_grads[name][head_only], bound, what=f"{name}, rows only the head reads")
    assert_gradients_within(grads, trl_grads, decoder_bound(config, PROMPT_LEN + C, dtype=torch.bfloat16))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_float32_lm_head_equals_trl_on_a_bfloat16_model(tmp_path, loss_type):
    """cast_lm_head_to_fp32 on a bfloat16 policy: the head's weight becomes float32 and its logits are computed in
    float32, on steadyrl's chunked head as in TRL's fused one: the same loss and gradients, up to rounding
    (``assert_same_up_to_rounding``). Padded on both sides: in bfloat16, packed attention (span by span) rounds the
    layers' outputs differently from TRL's padded pass, which would hide the head's equality (packed = padded is
    tested in float32: test_packing.py)."""
    policy = AutoModelForCausalLM.from_pretrained(toy_model_path(), dtype=torch.bfloat16)
    settings = dict(loss_type=loss_type, cast_lm_head_to_fp32=True, entropy_coef=0.05)
    trainer = steadyrl_side(
        tmp_path, "grpo", model=policy, beta=BETA, allow_low_precision_weights=True, packing=False, **settings
    )
    head = trainer.model.get_output_embeddings()
    assert head.weight.dtype == torch.float32 and trainer.model.model.norm.weight.dtype == torch.bfloat16
    tokens = fixed_batch(trainer.processing_class.pad_token_id)
    given = scoring_inputs(trainer, tokens)
    batch, inputs = parity_inputs(tokens, given)
    model = AutoModelForCausalLM.from_pretrained(toy_model_path(), dtype=torch.bfloat16).train()
    trl_grpo = trl_trainer("grpo", model, tmp_path, beta=BETA, **settings)
    model.load_state_dict(trainer.model.state_dict())  # both heads float32 now: an exact copy
    ours = loss_and_gradients(trainer.model, lambda: trainer.algorithm.loss(trainer.model, batch)[0] / GA)
    theirs = loss_and_gradients(model, lambda: trl_grpo._compute_loss(model, inputs))
    assert {name: g.dtype for name, g in ours[1].items()} == {name: g.dtype for name, g in theirs[1].items()}
    assert_same_up_to_rounding(ours, theirs, trainer.model, tokens, settings["entropy_coef"])
