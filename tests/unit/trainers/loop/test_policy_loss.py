"""The policy-loss seam from the trainer side: ``loss_type`` is checked against ops.POLICY_LOSSES (names, help, the
token-level options each objective reads, each loss's own checks), and adding a loss with a parameter is one class
plus one registry line (and its config field), which a config then accepts and checks and the trainers' loss, built
once, computes."""

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from support.toy_run import make_trainer

from steadyrl import GRPOConfig, RLOOConfig
from steadyrl.ops import POLICY_LOSSES, ClippedSurrogate, RegisteredLoss, TokenLoss, TokenMean
from steadyrl.rollout import Rollout
from steadyrl.trainers.config.policy_loss import accepted_loss_types
from steadyrl.trainers.loop.policy_loss import ConfiguredPolicyLoss


def config(config_class, tmp_path, **settings):
    return config_class(output_dir=str(tmp_path), report_to="none", use_cpu=True, **settings)


def refusal(config_class, tmp_path, **settings) -> str:
    with pytest.raises(ValueError) as err:
        config(config_class, tmp_path, **settings)
    return str(err.value)


def test_loss_type_accepts_the_registry_and_names_it_when_refused(tmp_path):
    shared = [name for name, loss in POLICY_LOSSES.items() if loss.shared]
    for name in shared:
        assert config(GRPOConfig, tmp_path, loss_type=name).loss_type == name
        assert config(RLOOConfig, tmp_path, loss_type=name).loss_type == name
    assert config(RLOOConfig, tmp_path, loss_type="rloo").loss_type == "rloo"
    assert set(accepted_loss_types(RLOOConfig.extra_loss_types)) == {*shared, "rloo"}
    grpo = refusal(GRPOConfig, tmp_path, loss_type="rloo")  # RLOO's own loss
    assert grpo.endswith(f"use one of {', '.join(shared)}.")
    rloo = refusal(RLOOConfig, tmp_path, loss_type="nope")
    assert rloo.endswith(f"use one of {', '.join(accepted_loss_types(('rloo',)))}.")
    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    assert all(f"{name} ({POLICY_LOSSES[name].description})" in help_text for name in shared)


def test_a_token_level_option_is_refused_for_a_loss_that_does_not_read_it(tmp_path):
    message = refusal(RLOOConfig, tmp_path, loss_type="rloo", importance_sampling_level="sequence")
    readers = [
        name
        for name in accepted_loss_types(("rloo",))
        if "importance_sampling_level" in POLICY_LOSSES[name].objective.reads
    ]
    assert message == (
        "importance_sampling_level='sequence' does not apply to loss_type='rloo' (TRL's RLOO loss, one importance "
        f"ratio per sequence): leave it unset, or use a loss_type that reads it ({', '.join(readers)})."
    )
    assert "delta=2.0 does not apply to loss_type='rloo'" in refusal(RLOOConfig, tmp_path, loss_type="rloo", delta=2.0)
    assert config(RLOOConfig, tmp_path, loss_type="bnpo", delta=2.0).delta == 2.0


class ScaledSurrogate(ClippedSurrogate):
    """A throwaway loss with a hyperparameter of its own: the clipped surrogate times ``scale``, no delta."""

    description = "the clipped surrogate, scaled"
    reads = frozenset({"importance_sampling_level", "vllm_importance_sampling_correction"})

    def __init__(self, scale: float, **clipping) -> None:
        super().__init__(**clipping)
        self.scale = scale

    @classmethod
    def from_config(cls, config) -> "ScaledSurrogate":
        clipping = ClippedSurrogate.from_config(config)
        return cls(config.surrogate_scale, cliprange=clipping.cliprange, cliprange_high=clipping.cliprange_high)

    @classmethod
    def check(cls, config) -> None:
        if not config.surrogate_scale > 0:
            raise ValueError(f"surrogate_scale={config.surrogate_scale!r} is invalid: it must be > 0.")

    def __call__(self, logprobs, old_logprobs, advantages, mask):
        out = super().__call__(logprobs, old_logprobs, advantages, mask)
        return TokenLoss(out.loss * self.scale, out.log_weights, out.flags)


@dataclass
class ScaledConfig(GRPOConfig):
    """The loss's field, declared by the user's config (steadyrl's own losses declare theirs in PolicyLossOptions)."""

    surrogate_scale: float = field(default=0.5, metadata={"help": "loss_type='scaled_bnpo': the scale."})


def toy_batch() -> Rollout:
    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(2, 3, generator=generator)
    return Rollout(
        prompt_ids=torch.ones(2, 2, dtype=torch.long),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        completion_ids=torch.ones(2, 3, dtype=torch.long),
        completion_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
        scores=torch.zeros(2),
        old_logprobs=logprobs + 0.3 * torch.randn(2, 3, generator=generator),
        advantages=torch.tensor([1.0, -1.0]),
    )


NO_MOE = SimpleNamespace(config=SimpleNamespace())  # a policy without a load-balancing loss


def test_adding_a_loss_with_a_parameter_is_one_class_and_one_registry_line(tmp_path, monkeypatch):
    monkeypatch.setitem(POLICY_LOSSES, "scaled_bnpo", RegisteredLoss(ScaledSurrogate, TokenMean))  # the one line

    args = config(ScaledConfig, tmp_path, loss_type="scaled_bnpo", surrogate_scale=0.25, beta=0.0)
    assert "scaled_bnpo" in refusal(GRPOConfig, tmp_path, loss_type="nope")
    assert "delta=2.0 does not apply to loss_type='scaled_bnpo'" in refusal(
        ScaledConfig, tmp_path, loss_type="scaled_bnpo", delta=2.0
    )
    message = refusal(ScaledConfig, tmp_path, loss_type="scaled_bnpo", surrogate_scale=0.0)
    assert message == "surrogate_scale=0.0 is invalid: it must be > 0."  # the loss's own check
    assert config(ScaledConfig, tmp_path, loss_type="bnpo", surrogate_scale=0.0)  # checked only where it is the loss
    batch = toy_batch()
    logprobs = batch.old_logprobs - 0.3 * torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    policy_loss = ConfiguredPolicyLoss(args, NO_MOE)
    assert policy_loss.loss.objective.scale == 0.25  # built once, holding its parameter
    loss, metrics = policy_loss(logprobs, batch, batch.policy_mask)
    bnpo, bnpo_metrics = POLICY_LOSSES["bnpo"].from_config(args)(
        logprobs, batch.old_logprobs, batch.advantages, batch.policy_mask
    )
    torch.testing.assert_close(loss, bnpo / 4)
    assert metrics == bnpo_metrics
    assert not policy_loss.divides_by_step_tokens  # a micro-batch token mean


def test_every_config_that_accepts_sapo_and_vespo_takes_their_settings(tmp_path):
    """SAPO's and VESPO's settings are fields of every config that accepts the loss (RLOO's too, where they were
    GRPO's alone), read by the loss alone, and checked by it with the same words."""
    args = config(RLOOConfig, tmp_path, loss_type="sapo", sapo_temperature_pos=2.0, sapo_temperature_neg=0.5)
    sapo = ConfiguredPolicyLoss(args, NO_MOE).loss.objective
    assert (sapo.temperature_pos, sapo.temperature_neg) == (2.0, 0.5)
    vespo = ConfiguredPolicyLoss(config(RLOOConfig, tmp_path, loss_type="vespo", vespo_k_neg=1.0), NO_MOE).loss
    assert vespo.objective.k_neg == 1.0
    for config_class in (GRPOConfig, RLOOConfig):
        message = refusal(config_class, tmp_path, loss_type="sapo", sapo_temperature_neg=float("inf"))
        assert message == "sapo_temperature_neg=inf is invalid: SAPO's gate temperature must be a finite number > 0."


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ({"loss_type": "dapo", "importance_sampling_level": "sequence"}, "weights each sequence by its completion"),
        ({"loss_type": "luspo"}, "loss_type='luspo' is meant for importance_sampling_level='sequence'"),
        ({"loss_type": "grpo", "importance_sampling_level": "sequence"}, None),
    ],
)
def test_loss_settings_trl_warns_about_are_warned_about(tmp_path, caplog, settings, warned):
    """TRL warns where a loss and the importance-sampling level do not match the paper's setup, when the trainer is
    built (TRL's own tests build the config first); so does steadyrl, with TRL's words."""
    GRPOConfig(output_dir=str(tmp_path), **settings)  # no warning yet
    with caplog.at_level("WARNING"):
        assert "importance_sampling_level" not in caplog.text
        make_trainer(tmp_path, algorithm="grpo", **settings)
    if warned is None:
        assert "importance_sampling_level" not in caplog.text
    else:
        assert warned in caplog.text
