"""RLOO's clipped loss, computed by the trainer, against hand-computed values (advantages:
unit/ops/test_rloo_math.py)."""

import torch
from support.toy_run import make_trainer

from steadyrl.rollout import Rollout


def test_clipped_loss_takes_the_pessimistic_branch(tmp_path):
    trainer = make_trainer(tmp_path, cliprange=0.2)

    class FixedLogits(torch.nn.Module):
        """Returns logits whose log-softmax puts log-prob `lp` on token 1 at every completion position."""

        def __init__(self, logprobs):
            super().__init__()
            self.logprobs = logprobs

        def forward(self, input_ids, **kwargs):
            b, t = input_ids.shape
            p = self.logprobs.exp()  # [B, C]
            probs = torch.stack([1 - p, p], dim=-1)  # two-token vocabulary
            logits = torch.zeros(b, t, 2)
            logits[:, -p.shape[1] - 1 : -1] = probs.log()
            return type("Out", (), {"logits": logits})()

    new = torch.log(torch.tensor([[0.6, 0.6], [0.3, 0.3]]))
    old = torch.log(torch.tensor([[0.4, 0.4], [0.4, 0.4]]))  # ratios 1.5 (clipped to 1.2) and 0.75 (clipped to 0.8)
    batch = Rollout(
        prompt_ids=torch.zeros(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1, dtype=torch.long),
        completion_ids=torch.ones(2, 2, dtype=torch.long),
        completion_mask=torch.ones(2, 2, dtype=torch.long),
        scores=torch.zeros(2),
        ref_logprobs=old,
        old_logprobs=old,
        advantages=torch.tensor([1.0, -1.0]),
    )
    loss, metrics = trainer.algorithm.loss(FixedLogits(new), batch)
    # A=+1, ratio 1.5: max(-1.5, -1.2) = -1.2 ; A=-1, ratio 0.75: max(0.75, 0.8) = 0.8 -> mean over 4 tokens
    torch.testing.assert_close(loss, torch.tensor((-1.2 * 2 + 0.8 * 2) / 4))
    assert metrics["clip_ratio"] == 1.0
