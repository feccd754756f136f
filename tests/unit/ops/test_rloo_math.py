"""RLOO's leave-one-out advantages against hand-computed values."""

import torch

from steadyrl.ops import leave_one_out_advantages, sequence_kl, whiten


def test_leave_one_out_advantages_with_kl_penalty():
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]])
    scores = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 6.0])
    old = torch.tensor([[-1.0, -1.0], [-1.0, -9.0], [-1.0, -1.0], [-2.0, -2.0], [-1.0, -1.0], [-1.0, -5.0]])
    ref = torch.tensor([[-1.5, -1.5], [-1.0, 0.0], [-1.0, -1.0], [-2.0, -2.0], [-1.0, -1.0], [-1.0, 0.0]])
    kl = sequence_kl(old, ref, mask)  # masked sum of old - ref: padding (the -9 and -5) does not count
    torch.testing.assert_close(kl, torch.tensor([1.0, 0, 0, 0, 0, 0]))
    advantages = leave_one_out_advantages(scores - 0.5 * kl, k=3)
    rewards = [[0.5, 2.0, 3.0], [0.0, 0.0, 6.0]]
    expected = []
    for group in rewards:
        for i, r in enumerate(group):
            others = [x for j, x in enumerate(group) if j != i]
            expected.append(r - sum(others) / 2)
    torch.testing.assert_close(advantages, torch.tensor(expected))
    assert advantages.view(2, 3).sum(1).abs().max() < 1e-6, "leave-one-out advantages of a prompt sum to zero"


def test_whiten_gives_zero_mean_unit_std():
    whitened = whiten(torch.tensor([1.0, 2.0, 3.0, 10.0]))
    assert abs(whitened.mean().item()) < 1e-6 and abs(whitened.std().item() - 1) < 1e-6
