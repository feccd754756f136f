"""Each registered policy loss (ops.POLICY_LOSSES) against a direct computation of its formula on random tensors:
the objective (clipped surrogate per token or per sequence, delta's cap, TRL's RLOO loss, TRL's CISPO), the vLLM
weights and the KL term in TRL's order, and each aggregation; the clip metrics; the registry's shape."""

from types import SimpleNamespace

import pytest
import torch

from steadyrl.ops import POLICY_LOSSES, Aggregation, PolicyLoss, RegisteredLoss

B, C, MAX_LENGTH, STEP_TOKENS = 6, 7, 9, 11.5
EPS, EPS_HIGH = 0.2, 0.28


def random_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Log-ratios wide enough that both clip bounds bind, advantages of both signs, ragged masks with an empty row."""
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(B, C, generator=generator, dtype=torch.float64) * 3
    lengths = torch.tensor([7, 3, 1, 5, 0, 6])
    return {
        "logprobs": logprobs.requires_grad_(),
        "old_logprobs": logprobs.detach() + 0.5 * torch.randn(B, C, generator=generator, dtype=torch.float64),
        "advantages": torch.randn(B, generator=generator, dtype=torch.float64),
        "mask": (torch.arange(C) < lengths.unsqueeze(1)).long(),
        "engine": torch.rand(B, C, generator=generator, dtype=torch.float64) * 2,
        "kl": torch.rand(B, C, generator=generator, dtype=torch.float64) * 0.1,
    }


def direct_clipped(batch, level: str, delta: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """-min(w A, clip(w, 1 - eps, 1 + eps_high) A), w capped at delta first; w per token or GSPO's per sequence."""
    mask = batch["mask"].double()
    log_ratio = batch["logprobs"] - batch["old_logprobs"]
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(1) / mask.sum(1).clamp(min=1)).unsqueeze(1)
    w, a = log_ratio.exp(), batch["advantages"].unsqueeze(1)
    unclipped = w if delta is None else torch.minimum(w, torch.tensor(delta, dtype=w.dtype))
    return -torch.minimum(unclipped * a, w.clamp(1 - EPS, 1 + EPS_HIGH) * a), w


def direct_aggregate(name: str, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_token, mask = per_token.expand(B, C), mask.double()
    if name == "grpo":
        return torch.stack(
            [per_token[i][mask[i] > 0].mean() if mask[i].any() else per_token.new_zeros(()) for i in range(B)]
        ).mean()
    if name == "bnpo":
        return per_token[mask > 0].mean()
    if name == "dr_grpo":
        return per_token[mask > 0].sum() / (B * MAX_LENGTH)
    assert name == "dapo"
    return per_token[mask > 0].sum() / STEP_TOKENS


def settings(**overrides) -> SimpleNamespace:
    """The config fields the registered losses read, at the configs' defaults but for ``overrides``."""
    defaults = dict(
        cliprange=EPS,
        cliprange_high=EPS_HIGH,
        max_completion_length=MAX_LENGTH,
        delta=None,
        importance_sampling_level="token",
        beta=0.0,
        use_bias_correction_kl=False,
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
        vespo_k_pos=2.0,
        vespo_lambda_pos=3.0,
        vespo_k_neg=3.0,
        vespo_lambda_neg=2.0,
    )
    return SimpleNamespace(**{**defaults, **overrides})


def compute(name: str, batch, config: SimpleNamespace, engine: bool = False, kl: bool = False):
    loss = POLICY_LOSSES[name].from_config(
        config, kl_coef=config.beta, kl_bias_correction=config.use_bias_correction_kl
    )
    return loss(
        batch["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["mask"],
        engine_weights=batch["engine"] if engine else None,
        kl=batch["kl"] if kl else None,
        tokens_per_micro_batch=STEP_TOKENS,
    )


@pytest.mark.parametrize("name", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("delta", [None, 1.5])
@pytest.mark.parametrize(
    ("engine", "kl", "bias_correction"), [(False, False, False), (True, True, True), (False, True, False)]
)
def test_clipped_surrogate_losses_equal_their_formula(name, level, delta, engine, kl, bias_correction):
    batch = random_batch()
    config = settings(importance_sampling_level=level, delta=delta, beta=0.04, use_bias_correction_kl=bias_correction)
    loss, metrics = compute(name, batch, config, engine, kl)
    per_token, w = direct_clipped(batch, level, delta)
    if engine:
        per_token = per_token * batch["engine"]
    if kl:
        per_token = per_token + 0.04 * batch["kl"] * (w if bias_correction else 1.0)
    expected = direct_aggregate(name, per_token, batch["mask"])
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss, batch["logprobs"])
    (expected_grad,) = torch.autograd.grad(expected, batch["logprobs"])
    torch.testing.assert_close(grad, expected_grad)
    assert set(metrics) == {"clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio"}


def test_clip_metrics_are_shares_of_the_loss_tokens():
    batch = random_batch(1)
    _, metrics = compute("bnpo", batch, settings())
    _, w = direct_clipped(batch, "token", None)
    a, tokens = batch["advantages"].unsqueeze(1), batch["mask"] > 0
    low, high = ((w < 1 - EPS) & (a < 0))[tokens], ((w > 1 + EPS_HIGH) & (a > 0))[tokens]
    assert low.any() and high.any(), "both bounds must bind"
    assert metrics["clip_ratio/low_mean"] == pytest.approx(low.double().mean().item())
    assert metrics["clip_ratio/high_mean"] == pytest.approx(high.double().mean().item())
    assert (
        metrics["clip_ratio"] == metrics["clip_ratio/region_mean"] == pytest.approx((low | high).double().mean().item())
    )


def test_rloo_loss_is_trls_per_sequence_ratio():
    """TRL's RLOOTrainer: w = exp(sum of the sequence's token log-ratios), clipped surrogate, mean over the sequences
    (an empty sequence included: w = 1)."""
    batch = random_batch(2)
    batch["old_logprobs"] = batch["logprobs"].detach() + 0.1 * torch.randn(B, C, dtype=torch.float64)
    loss, metrics = compute("rloo", batch, settings())
    mask = batch["mask"].double()
    w = ((batch["logprobs"] - batch["old_logprobs"]) * mask).sum(1).exp()
    a = batch["advantages"]
    expected = (-torch.minimum(w * a, w.clamp(1 - EPS, 1 + EPS_HIGH) * a)).mean()
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss, batch["logprobs"])
    (expected_grad,) = torch.autograd.grad(expected, batch["logprobs"])
    torch.testing.assert_close(grad, expected_grad)
    region = ((w < 1 - EPS) & (a < 0)) | ((w > 1 + EPS_HIGH) & (a > 0))  # per sequence, weighted by its tokens
    share = (region.double() * mask.sum(1)).sum() / mask.sum()
    assert metrics["clip_ratio"] == pytest.approx(share.item())


def test_the_registry_pairs_an_objective_with_an_aggregation_under_trls_names():
    assert list(POLICY_LOSSES)[:5] == ["grpo", "bnpo", "dr_grpo", "dapo", "rloo"]
    for name, loss in POLICY_LOSSES.items():
        assert isinstance(loss, RegisteredLoss), name
        assert issubclass(loss.objective, PolicyLoss) and issubclass(loss.aggregation, Aggregation), name
        assert loss.objective.description and loss.aggregation.description, name
    # RLOO's own, and PPO's actor and critic losses
    assert [name for name, loss in POLICY_LOSSES.items() if not loss.shared] == ["rloo", "ppo", "ppo_value"]
    assert [name for name, loss in POLICY_LOSSES.items() if loss.aggregation.step_tokens] == ["dapo", "cispo", "vespo"]
    assert POLICY_LOSSES["rloo"].objective.reads == frozenset()  # one ratio per sequence: no token-level option


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize(("engine", "kl"), [(False, False), (True, True)])
def test_cispo_equals_trls_formula(level, engine, kl):
    """TRL 1.16's GRPOTrainer._compute_loss with loss_type="cispo": coef = exp(log importance weight), per token or
    the sequence's mean; loss = -clamp(coef, max=epsilon_high).detach() x A x log pi, times the vLLM ratio, plus
    beta x KL x coef; sum over the loss tokens / the step's tokens per micro-batch (num_items_in_batch, rescaled)."""
    batch, eps_max = random_batch(3), 1.0  # some weights above eps_max, some below
    loss, metrics = compute(
        "cispo",
        batch,
        settings(cliprange_high=eps_max, importance_sampling_level=level, beta=0.04, use_bias_correction_kl=True),
        engine,
        kl,
    )
    logps, mask, a = batch["logprobs"], batch["mask"].double(), batch["advantages"].unsqueeze(1)
    log_ratio = logps - batch["old_logprobs"]
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    per_token_loss = -torch.clamp(coef_1, max=eps_max).detach() * a * logps
    if engine:
        per_token_loss = per_token_loss * batch["engine"]
    if kl:
        per_token_loss = per_token_loss + 0.04 * batch["kl"] * coef_1
    expected = (per_token_loss * mask).sum() / STEP_TOKENS
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss, logps)
    (expected_grad,) = torch.autograd.grad(expected, logps)
    torch.testing.assert_close(grad, expected_grad)
    clipped = ((coef_1 > eps_max) & (a > 0)).expand(B, C)[mask > 0]
    assert 0 < clipped.double().mean().item() < 1
    assert metrics == {"cispo_clip_ratio": pytest.approx(clipped.double().mean().item())}


@pytest.mark.parametrize(("engine", "kl"), [(False, False), (True, True)])
def test_vespo_equals_trls_formula_with_vllms_weights_folded_in(engine, kl):
    """TRL 1.16's loss_type="vespo": phi = GRPOTrainer.get_gamma_weights(A, log-ratio, mask, vLLM's per-token ratio)
    (detached), loss = -phi x A x log pi (vLLM's ratio inside phi, not multiplied into the loss), plus beta x KL x w;
    reduced as dapo. Non-default k and lambda, so the signs' shapes differ."""
    from trl import GRPOTrainer

    batch = random_batch(4)
    shape = dict(vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5)
    config = settings(beta=0.04, use_bias_correction_kl=True, **shape)
    loss, metrics = compute("vespo", batch, config, engine, kl)
    logps, mask, a = batch["logprobs"], batch["mask"].double(), batch["advantages"].unsqueeze(1)
    log_ratio = logps - batch["old_logprobs"]
    ratio = batch["engine"] if engine else None
    k_and_lambda = dict(k_pos=1.5, lambda_pos=2.5, k_neg=2.5, lambda_neg=1.5)
    phi = GRPOTrainer.get_gamma_weights(a, log_ratio, mask, ratio, **k_and_lambda)
    per_token_loss = -phi * a * logps
    if kl:
        per_token_loss = per_token_loss + 0.04 * batch["kl"] * log_ratio.exp()
    expected = (per_token_loss * mask).sum() / STEP_TOKENS
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss, logps)
    (expected_grad,) = torch.autograd.grad(expected, logps)
    torch.testing.assert_close(grad, expected_grad)
    assert metrics == {"vespo/phi_seq_mean": pytest.approx(phi.expand(B, C)[mask > 0].mean().item())}
    assert 0 < phi.min() < phi.max(), "the batch must give the sequences different weights"


def test_ppos_losses_through_the_registry_are_ppos_clipped_losses():
    """PPO's actor and critic losses, built from the registry (``ppo``, ``ppo_value``), give PPO's clipped losses
    (ops.clipped_policy_loss, ops.clipped_value_loss) to the bit: values, gradients and metrics."""
    from steadyrl.ops import clipped_policy_loss, clipped_value_loss

    batch, config = random_batch(5), settings(cliprange_value=0.1)
    token_advantages = torch.randn(B, C, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    args = (batch["logprobs"], batch["old_logprobs"], token_advantages, batch["mask"])
    ours, our_metrics = POLICY_LOSSES["ppo"].from_config(config)(*args)
    theirs, their_metrics = clipped_policy_loss(*args, EPS, EPS_HIGH)
    assert torch.equal(ours, theirs) and our_metrics == their_metrics
    assert list(our_metrics) == ["clip_ratio", "approx_kl"]
    assert torch.equal(*(torch.autograd.grad(loss, batch["logprobs"])[0] for loss in (ours, theirs)))

    values = batch["logprobs"]  # [B, C] with gradients: the critic's values
    old_values, returns = batch["old_logprobs"], batch["engine"]
    ours, our_metrics = POLICY_LOSSES["ppo_value"].from_config(config)(values, old_values, returns, batch["mask"])
    theirs, their_metrics = clipped_value_loss(values, old_values, returns, batch["mask"], 0.1)
    assert torch.equal(ours, theirs) and our_metrics == their_metrics
    assert 0 < our_metrics["value_clip_ratio"] < 1, "the clip must bind somewhere, not everywhere"
    assert torch.equal(*(torch.autograd.grad(loss, values)[0] for loss in (ours, theirs)))


def test_a_loss_is_built_once_and_owns_its_hyperparameters():
    """``from_config`` reads each hyperparameter once into the loss's own attributes: the loss then computes with
    them whatever the config object does later."""
    config = settings(sapo_temperature_pos=2.0, sapo_temperature_neg=3.0, importance_sampling_level="sequence")
    sapo = POLICY_LOSSES["sapo"].from_config(config).objective
    assert (sapo.temperature_pos, sapo.temperature_neg, sapo.importance_sampling_level) == (2.0, 3.0, "sequence")
    vespo = POLICY_LOSSES["vespo"].from_config(settings(vespo_k_pos=1.5, vespo_lambda_neg=0.5)).objective
    assert (vespo.k_pos, vespo.lambda_pos, vespo.k_neg, vespo.lambda_neg) == (1.5, 3.0, 3.0, 0.5)
    assert POLICY_LOSSES["dr_grpo"].from_config(config).aggregation.max_completion_length == MAX_LENGTH
    assert POLICY_LOSSES["cispo"].from_config(settings(cliprange_high=None)).objective.weight_max == EPS
    batch, built = random_batch(7), POLICY_LOSSES["dr_grpo"].from_config(config)
    before, _ = built(batch["logprobs"], batch["old_logprobs"], batch["advantages"], batch["mask"])
    config.max_completion_length, config.cliprange = 1, 0.01
    after, _ = built(batch["logprobs"], batch["old_logprobs"], batch["advantages"], batch["mask"])
    assert torch.equal(before, after)
