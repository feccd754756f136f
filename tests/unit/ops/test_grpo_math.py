"""GRPO's group-relative advantages and the vLLM engine importance weights against hand-computed values."""

import torch

from steadyrl.ops import engine_importance_weights, group_relative_advantages, zero_std_groups


def test_group_relative_advantages_centre_and_scale_as_asked():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 4.0])  # 3 prompts x 2 samples; the middle group ties
    centred = group_relative_advantages(rewards, 2, "none")
    assert torch.equal(centred, torch.tensor([0.5, -0.5, 0.0, 0.0, -1.0, 1.0]))
    group = group_relative_advantages(rewards, 2, "group")
    stds = torch.tensor([0.5, 0.0, 1.0]).mul(2**0.5).repeat_interleave(2)  # unbiased std of each pair
    torch.testing.assert_close(group, centred / (stds + 1e-4))
    batch = group_relative_advantages(rewards, 2, "batch", batch_std=torch.tensor(3.0))
    torch.testing.assert_close(batch, centred / 3.0001)
    assert zero_std_groups(rewards, 2).tolist() == [False, True, False]


def test_engine_importance_weights_truncate_or_mask():
    trainer_logprobs = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    engine = torch.log(torch.tensor([[0.1, 0.5], [0.3, 0.1]]))  # token ratios 5, 1 / 3, 1
    mask = torch.tensor([[1, 1], [1, 0]])
    truncated = engine_importance_weights(trainer_logprobs, engine, mask, "token_truncate", 3.0)
    torch.testing.assert_close(truncated, torch.tensor([[3.0, 1.0], [3.0, 1.0]]))
    masked = engine_importance_weights(trainer_logprobs, engine, mask, "token_mask", 4.0)
    torch.testing.assert_close(masked, torch.tensor([[0.0, 1.0], [3.0, 1.0]]))
    sequence = engine_importance_weights(trainer_logprobs, engine, mask, "sequence_truncate", 4.0, 0.5)
    torch.testing.assert_close(sequence, torch.tensor([[4.0], [3.0]]))
