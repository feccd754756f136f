"""A Mixture-of-Experts policy's load-balancing loss in GRPO's and RLOO's loss (TRL 1.16's router_aux_loss_coef and
aux_loss_enabled): the model config's own weight by default, the given one otherwise, equal to TRL's loss and
gradients on the same batch; and a weight given for a dense model is refused."""

import pytest
import torch
from support.trl_parity import (
    BETA,
    GA,
    assert_same,
    fixed_batch,
    loss_and_gradients,
    parity_inputs,
    scoring_inputs,
    steadyrl_side,
    trl_trainer,
)
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

from steadyrl.toy import toy_model_path


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    """A tiny Qwen3-MoE (4 experts, 2 per token) with the toy tokenizer; its config declares a 0.02 weight."""
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        router_aux_loss_coef=0.02,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("moe")
    Qwen3MoeForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize(("algorithm", "coef"), [("grpo", None), ("grpo", 0.5), ("rloo", None)])
def test_load_balancing_loss_equals_trl(tmp_path, moe_path, algorithm, coef):
    loss_type = "dapo" if algorithm == "grpo" else "bnpo"
    settings = dict(loss_type=loss_type, router_aux_loss_coef=coef)
    beta = BETA if algorithm == "grpo" else 0.0  # RLOO's KL is in its reward
    trainer = steadyrl_side(tmp_path, algorithm, model=str(moe_path), beta=beta, **settings)
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == (0.02 if coef is None else coef)
    tokens = fixed_batch(trainer.processing_class.pad_token_id)
    given = scoring_inputs(trainer, tokens)  # (its reference log-probs: the dense toy model's)
    batch, inputs = parity_inputs(tokens, given)
    ours = loss_and_gradients(trainer.model, lambda: trainer.algorithm.loss(trainer.model, batch)[0] / GA)
    metrics = trainer.algorithm.loss(trainer.model, batch)[1]
    assert metrics["aux_loss"] > 0

    model = AutoModelForCausalLM.from_pretrained(moe_path)
    model.load_state_dict(trainer.model.state_dict())
    trl_grpo = trl_trainer("grpo", model.train(), tmp_path, beta=beta, **settings)
    assert trl_grpo.aux_loss_enabled
    assert_same(ours, loss_and_gradients(model, lambda: trl_grpo._compute_loss(model, inputs)))
    with_term = trainer.algorithm.loss(trainer.model, batch)[0]
    trainer.algorithm.policy_loss.router_aux_loss_coef = 0.0  # the same model and batch without the term: another loss
    assert trainer.algorithm.loss(trainer.model, batch)[0] != with_term
