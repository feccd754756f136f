"""The scoring pass the memory-lean path skips (one step per rollout, one epoch, beta 0) changes nothing (the lean
log-probs themselves: unit/ops/test_logprobs.py)."""

import torch
from conftest import step_entries
from support.toy_run import make_trainer

from steadyrl import RLOOTrainer
from steadyrl.trainers.rloo import RLOO

TOLERANCE = dict(atol=1e-6, rtol=1e-6)


class ForcedOldPassRLOO(RLOO):
    def needs_old_logprobs(self) -> bool:
        return True


class ForcedOldPass(RLOOTrainer):
    algorithm_class = ForcedOldPassRLOO


def test_skipping_the_old_logprob_pass_changes_no_metric(tmp_path):
    """One optimizer step per rollout, one epoch, beta 0: the old pass is skipped; forcing it changes nothing
    beyond float rounding."""
    one_step = dict(
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        train_batch_size=8,
        micro_train_batch_size=4,
        num_ppo_epochs=1,
        beta=0.0,
        max_steps=4,
        save_steps=4,
    )
    skipped = make_trainer(tmp_path / "skipped", **one_step)
    assert not skipped.algorithm.needs_old_logprobs()
    skipped.train()
    forced = make_trainer(tmp_path / "forced", trainer_cls=ForcedOldPass, **one_step)
    forced.train()
    for a, b in zip(step_entries(skipped.state.log_history), step_entries(forced.state.log_history), strict=True):
        assert a.keys() == b.keys()
        for key in a.keys() - {"tokens_per_second"}:
            assert abs(a[key] - b[key]) < 1e-5, (a["step"], key, a[key], b[key])
    for name, param in skipped.model.named_parameters():
        torch.testing.assert_close(param, forced.model.get_parameter(name), **TOLERANCE)
