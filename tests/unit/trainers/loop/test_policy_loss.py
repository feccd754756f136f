"""The policy-loss seam from the trainer side: ``loss_type`` is checked against ops.POLICY_LOSSES (names, help, the
token-level options each objective reads), and adding a loss is one class plus one registry line, which a config
then accepts and the trainers' loss computes."""

from types import SimpleNamespace

import pytest
import torch
from support.toy_run import make_trainer

from steadyrl import GRPOConfig, RLOOConfig
from steadyrl.ops import POLICY_LOSSES, ClippedSurrogate, LossSettings, RegisteredLoss, TokenLoss, TokenMean
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


class HalfSurrogate(ClippedSurrogate):
    """A throwaway loss: half the clipped surrogate, and no delta."""

    description = "half the clipped surrogate"
    reads = frozenset({"importance_sampling_level", "vllm_importance_sampling_correction"})

    def __call__(self, logprobs, old_logprobs, advantages, mask, settings):
        out = super().__call__(logprobs, old_logprobs, advantages, mask, settings)
        return TokenLoss(out.loss / 2, out.log_weights, out.flags)


def test_adding_a_loss_is_one_class_and_one_registry_line(tmp_path, monkeypatch):
    monkeypatch.setitem(POLICY_LOSSES, "half_bnpo", RegisteredLoss(HalfSurrogate(), TokenMean()))  # the one line

    args = config(GRPOConfig, tmp_path, loss_type="half_bnpo", beta=0.0)
    assert "half_bnpo" in refusal(GRPOConfig, tmp_path, loss_type="nope")
    assert "delta=2.0 does not apply to loss_type='half_bnpo'" in refusal(
        GRPOConfig, tmp_path, loss_type="half_bnpo", delta=2.0
    )
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    logprobs = -torch.rand(2, 3, generator=generator)
    batch = Rollout(
        prompt_ids=torch.ones(2, 2, dtype=torch.long),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        completion_ids=torch.ones(2, 3, dtype=torch.long),
        completion_mask=mask,
        scores=torch.zeros(2),
        old_logprobs=logprobs + 0.3 * torch.randn(2, 3, generator=generator),
        advantages=torch.tensor([1.0, -1.0]),
    )
    no_moe = SimpleNamespace(config=SimpleNamespace())  # a policy without a load-balancing loss
    loss, metrics = ConfiguredPolicyLoss(args, no_moe)(logprobs, batch, batch.policy_mask)
    bnpo, bnpo_metrics = POLICY_LOSSES["bnpo"](
        logprobs, batch.old_logprobs, batch.advantages, mask, LossSettings.of(args)
    )
    torch.testing.assert_close(loss, bnpo / 2)
    assert metrics == bnpo_metrics
    assert not ConfiguredPolicyLoss(args, no_moe).divides_by_step_tokens  # a micro-batch token mean


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
