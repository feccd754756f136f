"""PPO's math against small examples worked out by hand: GAE, the clipped policy and value losses, KL estimators."""

import math
import threading

import pytest
import torch

from steadyrl.ops import (
    RunningMoments,
    adaptive_kl_coef,
    clipped_policy_loss,
    clipped_value_loss,
    generalized_advantage_estimation,
    kl_penalty,
    masked_moments,
    masked_whiten,
    shaped_token_rewards,
    whiten,
)


def test_gae_matches_hand_computed_example():
    # Row 0: two real tokens then padding whose reward and value must be ignored. Row 1: three real tokens.
    rewards = torch.tensor([[0.0, 1.0, 5.0], [0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.25, 7.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    advantages, returns = generalized_advantage_estimation(rewards, values, mask, gamma=0.9, lam=0.8)
    # Row 0: delta_1 = 1 - 0.25 = 0.75; delta_0 = 0.9 * 0.25 - 0.5 = -0.275; A_0 = -0.275 + 0.72 * 0.75 = 0.265.
    # Row 1: A_2 = 2 - 1 = 1; A_1 = (0.9 - 1) + 0.72 * 1 = 0.62; A_0 = -0.1 + 0.72 * 0.62 = 0.3464.
    expected = torch.tensor([[0.265, 0.75, 0.0], [0.3464, 0.62, 1.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.tensor([[0.765, 1.0, 0.0], [1.3464, 1.62, 2.0]]))


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.1, -0.2, 0.3, 1.0]])
    values = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    advantages, returns = generalized_advantage_estimation(rewards, values, torch.ones(1, 4), gamma=1.0, lam=1.0)
    reward_to_go = torch.tensor([[1.2, 1.1, 1.3, 1.0]])
    torch.testing.assert_close(returns, reward_to_go)
    torch.testing.assert_close(advantages, reward_to_go - values)


def test_clipped_policy_loss_matches_hand_computed_example():
    # Ratios 1.5 (A=+1: clip binds, -1.2), 0.5 (A=+1: unclipped -0.5 is larger), 0.5 (A=-2: clip binds, +1.6);
    # the fourth token is padding.
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 0.5, 0.5, 9.0]]))
    advantages = torch.tensor([[1.0, 1.0, -2.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = clipped_policy_loss(new, old, advantages, mask, cliprange=0.2)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.6) / 3)
    assert metrics["clip_ratio"] == pytest.approx(2 / 3)


def test_clipped_policy_loss_gradient_vanishes_where_clipped():
    new = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)
    loss, _ = clipped_policy_loss(new, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), cliprange=0.2)
    loss.backward()
    assert new.grad[0, 0] == 0  # ratio 1.5 > 1.2: no push further
    assert new.grad[0, 1] == pytest.approx(-1.1 / 2)  # d(-r)/dlogp = -r, averaged over 2 tokens


def test_clipped_value_loss_matches_hand_computed_example():
    # Token 0: V moves 0 -> 1.0, clipped to 0.2; target 1.5: max((1 - 1.5)^2, (0.2 - 1.5)^2) = 1.69 (clip binds).
    # Token 1: V moves 0 -> -0.1 (inside the range); target 1.0: 1.21. Token 2 is padding.
    values = torch.tensor([[1.0, -0.1, 50.0]])
    old_values = torch.zeros(1, 3)
    returns = torch.tensor([[1.5, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = clipped_value_loss(values, old_values, returns, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (1.69 + 1.21) / 2)
    assert metrics["value_clip_ratio"] == pytest.approx(0.5)


def test_kl_estimators():
    logprobs, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.0])
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k1"), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k3"), torch.tensor([math.exp(-1) - 1 + 1, 0.0]))
    with pytest.raises(ValueError, match="kl_estimator='k2'"):
        kl_penalty(logprobs, ref, "k2")


def test_shaped_rewards_put_the_score_on_each_last_token_and_the_kl_penalty_everywhere():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])  # row 2: an empty completion scores at index 0
    token_kl = torch.tensor([[0.5, -1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 0.0]])
    rewards, non_score = shaped_token_rewards(torch.tensor([3.0, -1.0, 7.0]), token_kl, kl_coef=0.1, mask=mask)
    torch.testing.assert_close(non_score, -0.1 * token_kl)
    expected = -0.1 * token_kl
    expected[0, 1] += 3.0
    expected[1, 2] -= 1.0
    expected[2, 0] += 7.0
    torch.testing.assert_close(rewards, expected)


def test_running_moments_equal_the_moments_of_everything_seen():
    batches = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([-3.0]), torch.tensor([0.5, 8.0, 2.5, 2.0])]
    moments = RunningMoments()
    for batch in batches:
        moments = moments.updated(batch)
    everything = torch.cat(batches).double()
    assert moments.count == 8
    assert moments.mean == pytest.approx(everything.mean().item())
    assert moments.var == pytest.approx(everything.var(unbiased=False).item())
    assert RunningMoments.from_state_dict(moments.state_dict()) == moments
    torch.testing.assert_close(moments.normalize(torch.tensor([moments.mean])), torch.zeros(1), atol=1e-6, rtol=0)


def test_adaptive_kl_coef_moves_towards_the_target_by_at_most_20_percent_per_horizon():
    assert adaptive_kl_coef(0.1, observed_kl=0.2, target_kl=0.1, num_samples=100, horizon=100) == pytest.approx(0.12)
    assert adaptive_kl_coef(0.1, observed_kl=0.0, target_kl=0.1, num_samples=100, horizon=100) == pytest.approx(0.08)
    assert adaptive_kl_coef(0.1, observed_kl=0.105, target_kl=0.1, num_samples=10, horizon=100) == pytest.approx(
        0.1 * (1 + 0.05 * 0.1)
    )


def test_masked_whiten_uses_completion_tokens_only():
    values = torch.tensor([[1.0, 3.0, 100.0]])
    whitened = masked_whiten(values, torch.tensor([[1, 1, 0]]))
    # mean 2, unbiased variance 2 over the two real tokens; padding is zeroed
    torch.testing.assert_close(whitened, torch.tensor([[-(0.5**0.5), 0.5**0.5, 0.0]]), atol=1e-6, rtol=0)


class ThreadSums:
    """``sum_over_processes`` for threads standing in for processes: each call returns the sum of every thread's
    tensor at the same call."""

    def __init__(self, threads: int) -> None:
        self.barrier, self.parts, self.local = threading.Barrier(threads), [[] for _ in range(8)], threading.local()

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        call = self.local.calls = getattr(self.local, "calls", -1) + 1
        self.parts[call].append(tensor)
        self.barrier.wait(timeout=10)
        return torch.stack(self.parts[call]).sum(0)


def whiten_in_shares(values, mask, processes: int, whiten_share) -> torch.Tensor:
    """Each of ``processes`` threads whitens its rows with the moments of every thread's rows; all rows, in order."""
    sums, shares = ThreadSums(processes), list(zip(values.chunk(processes), mask.chunk(processes)))
    results = [None] * processes

    def process(rank: int) -> None:
        share, share_mask = shares[rank]
        results[rank] = whiten_share(share, share_mask, masked_moments(share, share_mask, sums))

    threads = [threading.Thread(target=process, args=(rank,)) for rank in range(processes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return torch.cat(results)


def test_whitening_with_every_process_moments_equals_whitening_the_whole_rollout():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(6, 5, generator=generator) * 3 + 1  # [N, C]: 3 rows per process
    mask = torch.rand(6, 5, generator=generator) > 0.3
    mask[:3] &= torch.arange(5) < 2  # the first process's completions are shorter: unequal token counts
    whole = masked_whiten(values, mask)
    torch.testing.assert_close(whiten_in_shares(values, mask, 2, masked_whiten), whole)
    own = torch.cat([masked_whiten(v, m) for v, m in zip(values.chunk(2), mask.chunk(2))])
    assert not torch.allclose(own, whole, atol=1e-2), "each process's own moments differ from the rollout's"
    sequence_values = values[:, 0]  # RLOO: one advantage per sequence, no mask
    per_share = whiten_in_shares(sequence_values, torch.ones_like(sequence_values), 2, lambda v, m, mom: whiten(v, mom))
    torch.testing.assert_close(per_share, whiten(sequence_values))
    # one process: the moments are the tensor's own, computed exactly as before
    mean, var = masked_moments(values, mask)
    assert torch.equal(whole, (values - mean) * torch.rsqrt(var + 1e-8) * mask)


def test_clip_higher_lets_the_ratio_grow_further_than_it_may_shrink():
    # ratio 1.25 with A=+1: clipped at 1.2 symmetric (gradient 0), free under epsilon_high=0.28 (gradient -r/1)
    new = torch.log(torch.tensor([[1.25]])).requires_grad_(True)
    loss, metrics = clipped_policy_loss(new, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.28)
    loss.backward()
    assert loss.item() == pytest.approx(-1.25) and metrics["clip_ratio"] == 0
    assert new.grad.item() == pytest.approx(-1.25)
    # ratio 0.75 with A=-1 is clipped at 1 - 0.2 whatever epsilon_high is
    loss, _ = clipped_policy_loss(
        torch.log(torch.tensor([[0.75]])), torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.28
    )
    assert loss.item() == pytest.approx(0.8)
