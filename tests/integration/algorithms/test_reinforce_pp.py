"""REINFORCE++ on the toy task: a run trains, and the advantages and loss it computed are those of the pure functions
(ops: approx_kl, reinforce_pp_advantages, POLICY_LOSSES; their formulas: unit/ops/test_reinforce_pp.py)."""

import pytest
import torch
from support.toy_run import make_trainer

from steadyrl import ReinforcePPConfig
from steadyrl.ops import (
    POLICY_LOSSES,
    approx_kl,
    completion_logprobs,
    fit_columns,
    masked_mean,
    masked_var,
    reinforce_pp_advantages,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """4 steps (one rollout: 8 samples, 2 epochs x 2 mini-batches), KL k3 in the reward with init_kl_coef 0.05."""
    trainer = make_trainer(
        tmp_path_factory.mktemp("reinforce-pp"), algorithm="reinforce-pp", max_steps=4, save_steps=4, kl_estimator="k3"
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    return trainer, before


def expected_advantages(rollout, args, group_size=None) -> torch.Tensor:
    mask = rollout.policy_mask
    token_kl = approx_kl(rollout.old_logprobs, rollout.ref_logprobs, args.kl_estimator) * mask
    advantages, _ = reinforce_pp_advantages(
        rollout.scores, token_kl, mask, args.init_kl_coef, args.gamma, group_size, clip=args.reward_clip_range
    )
    return advantages


def test_a_run_trains_with_whitened_per_token_advantages(trained):
    trainer, before = trained
    rollout = trainer.training_buffer.buffer.rollout  # with the advantages it was trained on
    assert rollout.advantages.shape == rollout.completion_mask.shape  # one per token
    mask = rollout.policy_mask.float()
    assert (rollout.advantages * (1 - mask)).abs().max() == 0, "padding has no advantage"
    assert abs(masked_mean(rollout.advantages, mask).item()) < 1e-5
    assert masked_var(rollout.advantages, mask).item() == pytest.approx(1.0, rel=1e-4)
    torch.testing.assert_close(rollout.advantages, expected_advantages(rollout, trainer.args))
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert len(steps) == 4 and all("kl" in log and "rlhf_reward" in log for log in steps)
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    assert changed, "no weight moved"


def test_the_loss_is_the_token_level_clipped_surrogate_of_the_per_token_advantages(trained):
    trainer, _ = trained
    batch = trainer.training_buffer.buffer.rollout.select(slice(0, 2))
    loss, metrics = trainer.algorithm.loss(trainer.model, batch)
    logprobs, _ = completion_logprobs(trainer.model, *batch.token_tensors, temperature=trainer.args.temperature)
    expected, _ = POLICY_LOSSES["dapo"].from_config(trainer.args)(
        logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.policy_mask,
        tokens_per_micro_batch=batch.tokens_per_micro_batch[0],
    )
    torch.testing.assert_close(loss, expected)
    assert "clip_ratio" in metrics and "entropy" in metrics


def test_reinforce_baseline_takes_each_prompts_mean_score_off(trained, tmp_path):
    trainer, _ = trained
    rollout = trainer.training_buffer.buffer.rollout
    baseline = make_trainer(tmp_path, algorithm="reinforce-pp", advantage_estimator="reinforce_baseline")
    got = baseline.algorithm.advantages(rollout).advantages
    expected = expected_advantages(rollout, baseline.args, group_size=2)
    torch.testing.assert_close(fit_columns(got, expected.shape[1]), expected)
    assert not torch.allclose(got, rollout.advantages), "the baseline changed nothing"


def test_openrlhf_names_and_defaults():
    args = ReinforcePPConfig(output_dir="unused", report_to="none")
    assert (args.advantage_estimator, args.gamma, args.beta, args.init_kl_coef) == ("reinforce", 1.0, 0.01, 0.01)
    assert (args.kl_estimator, args.reward_clip_range, args.loss_type) == ("k1", (-10.0, 10.0), "dapo")
    args.init_kl_coef = 0.2  # a view of beta: one value
    assert args.beta == 0.2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"advantage_estimator": "gae"}, "advantage_estimator='gae' is invalid: use 'reinforce' or "),
        ({"loss_type": "vespo"}, "loss_type='vespo' takes one advantage per sequence"),
        ({"kl_estimator": "k4"}, "kl_estimator='k4' is invalid: use one of k1, k2, k3"),
        ({"gamma": 0.0}, "gamma=0.0 is invalid: it must be in"),
        ({"advantage_estimator": "reinforce_baseline", "gamma": 0.9}, "gamma=0.9 does not apply to"),
        ({"advantage_estimator": "reinforce_baseline", "n_samples_per_prompt": 1}, "n_samples_per_prompt=1 is too few"),
        ({"init_kl_coef": 0.1, "beta": 0.2}, "init_kl_coef=0.1 contradicts beta=0.2"),
        ({"reward_clip_range": [1.0, -1.0]}, "reward_clip_range=[1.0, -1.0] is invalid"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        ReinforcePPConfig(output_dir="unused", report_to="none", **settings)
