"""Online DPO's preference losses against their formulas, and pairs kept whole in mini-batches."""

import torch

from steadyrl.ops import preference_loss
from steadyrl.rollout import minibatch_schedule


def test_preference_losses_against_their_formulas():
    logits = torch.tensor([-1.0, 0.0, 2.0])
    torch.testing.assert_close(preference_loss(logits, 0.5, "sigmoid"), -torch.log(torch.sigmoid(0.5 * logits)))
    torch.testing.assert_close(preference_loss(logits, 0.5, "ipo"), (logits - 1.0) ** 2)


def test_pairs_stay_whole_and_in_order_in_every_minibatch():
    schedule = minibatch_schedule(num_samples=16, minibatch_size=4, num_epochs=3, group_size=2)
    assert len(schedule) == 12 and all(len(batch) == 4 for batch in schedule)
    for batch in schedule:
        assert all(batch[i] % 2 == 0 and batch[i + 1] == batch[i] + 1 for i in range(0, 4, 2))
    for epoch in range(3):
        assert sorted(i for batch in schedule[4 * epoch : 4 * epoch + 4] for i in batch) == list(range(16))
