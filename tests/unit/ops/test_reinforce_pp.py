"""REINFORCE++ and REINFORCE++-baseline (Hu, 2025) advantages: against hand-computed values, and against plain
re-implementations of OpenRLHF's formula (experience_maker.py: compute_reward, get_cumulative_returns, the whitening
in compute_advantages_and_returns) and verl's (core_algos.py: compute_reinforce_plus_plus_outcome_advantage,
compute_reinforce_plus_plus_baseline_outcome_advantage)."""

import math
import threading
from types import SimpleNamespace

import pytest
import torch

from steadyrl.ops import (
    POLICY_LOSSES,
    approx_kl,
    discounted_returns,
    kl_penalised_rewards,
    reinforce_pp_advantages,
)


def test_kl_penalised_rewards_put_the_score_on_the_last_token():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 9.0, 9.0], [1.0, 2.0, 9.0]])  # 9: padding, must not count
    rewards = kl_penalised_rewards(torch.tensor([1.0, 2.0, 3.0]), kl, 0.5, mask)
    expected = torch.tensor([[-0.05, -0.1, -0.15 + 1.0], [-0.25 + 2.0, 0.0, 0.0], [-0.5, -1.0 + 3.0, 0.0]])
    torch.testing.assert_close(rewards, expected)


def test_kl_penalised_rewards_score_the_last_sampled_token_of_a_mask_with_holes():
    mask = torch.tensor([[1, 0, 1, 0]])  # multi-turn: token 1 a tool's, token 3 padding
    rewards = kl_penalised_rewards(torch.tensor([1.0]), torch.zeros(1, 4), 0.1, mask)
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))


def test_discounted_returns_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 4.0], [8.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    returns = discounted_returns(rewards, mask, gamma=0.5)
    # row 0: G2 = 4, G1 = 2 + 0.5 * 4 = 4, G0 = 1 + 0.5 * 4 = 3; row 1: the padding's 5s count as 0
    torch.testing.assert_close(returns, torch.tensor([[3.0, 4.0, 4.0], [8.0, 0.0, 0.0]]))


def test_approx_kl_estimators_and_clamp():
    logprobs, ref = torch.tensor([[-1.0, -20.0]]), torch.tensor([[-2.0, -1.0]])
    log_ratio = logprobs - ref  # [1, -19]
    torch.testing.assert_close(approx_kl(logprobs, ref, "k1"), torch.tensor([[1.0, -10.0]]))  # clamped to +-10
    torch.testing.assert_close(approx_kl(logprobs, ref, "k2"), (log_ratio**2 / 2).clamp(max=10))
    k3 = torch.expm1(-log_ratio) + log_ratio
    torch.testing.assert_close(approx_kl(logprobs, ref, "k3"), k3.clamp(-10, 10))
    with pytest.raises(ValueError, match="kl_estimator='k4' is invalid: use one of k1, k2, k3"):
        approx_kl(logprobs, ref, "k4")


def test_reinforce_advantages_by_hand():
    """Two sequences, gamma 1, kl_coef 0.5: returns are the score plus the KL penalties from t on; whitened over the
    three completion tokens with their unbiased variance."""
    mask = torch.tensor([[1, 1], [1, 0]])
    kl = torch.tensor([[0.2, 0.4], [1.0, 0.0]])
    advantages, returns = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), kl, mask, kl_coef=0.5)
    # row 0: r = [-0.1, -0.2 + 1] -> G = [0.7, 0.8]; row 1: r = [-0.5] -> G = [-0.5]
    torch.testing.assert_close(returns, torch.tensor([[0.7, 0.8], [-0.5, 0.0]]))
    values = torch.tensor([0.7, 0.8, -0.5])
    whitened = (values - values.mean()) / values.std()
    torch.testing.assert_close(advantages, torch.tensor([[whitened[0], whitened[1]], [whitened[2], 0.0]]))


def test_reinforce_baseline_subtracts_the_prompt_mean_score_first():
    mask = torch.ones(4, 1)
    scores = torch.tensor([1.0, 0.0, 5.0, 3.0])  # prompt means 0.5 and 4
    _, returns = reinforce_pp_advantages(scores, torch.zeros(4, 1), mask, kl_coef=0.1, group_size=2)
    torch.testing.assert_close(returns.flatten(), torch.tensor([0.5, -0.5, 1.0, -1.0]))


def test_without_std_norm_advantages_are_only_centred():
    mask = torch.ones(2, 1)
    advantages, _ = reinforce_pp_advantages(torch.tensor([3.0, 1.0]), torch.zeros(2, 1), mask, 0.0, std_norm=False)
    torch.testing.assert_close(advantages.flatten(), torch.tensor([1.0, -1.0]))


# ---- OpenRLHF's and verl's formulas, re-implemented plainly ------------------------------------------------------


def openrlhf_advantages(scores, log_probs, ref_log_probs, action_mask, kl_coef, gamma, estimator, k=None, clip=None):
    """OpenRLHF: rewards minus the group mean (reinforce_baseline), compute_reward (KL per token, the score at the
    last action token), get_cumulative_returns, then (x - mean) * rsqrt(max(population var, 1e-8)) over all
    action tokens."""
    rewards = scores.clone()
    if k is not None:
        grouped = rewards.view(-1, k)
        rewards = (grouped - grouped.mean(-1, keepdim=True)).flatten()
    if clip:
        rewards = rewards.clamp(min=clip[0], max=clip[1])
    log_ratio = log_probs.float() - ref_log_probs.float()
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = log_ratio**2 / 2.0
    else:
        kl = (-log_ratio).exp() - 1 + log_ratio
    kl = kl.clamp(min=-10, max=10)
    eos = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    reward = torch.zeros_like(kl).scatter_(1, eos, rewards.unsqueeze(1)) - kl_coef * kl
    reward = action_mask * reward
    returns, running = torch.zeros_like(reward), torch.zeros(reward.size(0))
    for t in reversed(range(reward.size(1))):
        running = reward[:, t] + gamma * running
        returns[:, t] = running
    n = action_mask.sum()
    mean = (returns * action_mask).sum() / n
    var = ((returns - mean).pow(2) * action_mask).sum() / n
    return (returns - mean) * var.clamp(min=1e-8).rsqrt(), returns


def verl_masked_whiten(values, mask):
    mean = (values * mask).sum() / mask.sum()
    var = ((values - mean) ** 2 * mask).sum() / (mask.sum() - 1)  # unbiased
    return (values - mean) * torch.rsqrt(var + 1e-8)


def random_rollout(seed, n=8, c=6):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, c + 1, (n,), generator=generator)
    mask = (torch.arange(c)[None, :] < lengths[:, None]).float()
    scores = torch.randint(0, 2, (n,), generator=generator).float() + torch.rand(n, generator=generator)
    logprobs = -torch.rand(n, c, generator=generator) * 3
    ref = -torch.rand(n, c, generator=generator) * 3
    return scores, logprobs, ref, mask


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("k", [None, 4])
def test_equals_openrlhf(estimator, gamma, k):
    scores, logprobs, ref, mask = random_rollout(0)
    kl = approx_kl(logprobs, ref, estimator)
    clip = (-0.3, 1.2)  # binds on some scores (in [0, 2)) and some centred ones
    ours, returns = reinforce_pp_advantages(scores, kl, mask, 0.05, gamma, group_size=k, clip=clip)
    theirs, their_returns = openrlhf_advantages(scores, logprobs, ref, mask, 0.05, gamma, estimator, k, clip)
    torch.testing.assert_close(returns, their_returns * mask)
    n = mask.sum().item()  # OpenRLHF divides the squared deviations by n, steadyrl (and verl) by n - 1
    torch.testing.assert_close(ours * math.sqrt(n / (n - 1)), theirs * mask)


def test_equals_verl_reinforce_plus_plus():
    """verl's compute_reinforce_plus_plus_outcome_advantage on token_level_rewards that already hold the KL penalty
    (use_kl_in_reward): discounted returns, masked_whiten."""
    scores, logprobs, ref, mask = random_rollout(1)
    kl = approx_kl(logprobs, ref, "k1")
    token_level_rewards = kl_penalised_rewards(scores, kl, 0.05, mask)
    returns, running = torch.zeros_like(token_level_rewards), 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + 0.9 * running
        returns[:, t] = running
        running = running * mask[:, t]
    theirs = verl_masked_whiten(returns, mask) * mask
    ours, _ = reinforce_pp_advantages(scores, kl, mask, 0.05, gamma=0.9)
    torch.testing.assert_close(ours, theirs)


def test_equals_verl_baseline_without_kl():
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage: the score minus its prompt's mean, the same at
    every token, whitened. Without a KL penalty in the reward (verl's default) it equals OpenRLHF's and steadyrl's;
    with one verl sums the sequence's KL into the score instead of keeping it per token."""
    scores, _, _, mask = random_rollout(2)
    grouped = scores.view(-1, 4)
    centred = (grouped - grouped.mean(-1, keepdim=True)).flatten()
    theirs = verl_masked_whiten(centred[:, None] * mask, mask) * mask
    ours, _ = reinforce_pp_advantages(scores, torch.zeros_like(mask), mask, 0.0, group_size=4)
    torch.testing.assert_close(ours, theirs)


def test_whitening_over_processes_equals_one_process():
    """Split over two processes (threads whose all-reduce sums both shares), the advantages equal the whole batch's:
    the statistics are taken over the whole rollout."""
    scores, logprobs, ref, mask = random_rollout(3)
    kl = approx_kl(logprobs, ref, "k1")
    whole, _ = reinforce_pp_advantages(scores, kl, mask, 0.05)
    halves, shares, results = [slice(0, 3), slice(3, 8)], [None, None], [None, None]
    barrier = threading.Barrier(2)

    def process(rank):
        def all_reduce_sum(values):
            shares[rank] = values
            barrier.wait()
            summed = shares[0] + shares[1]
            barrier.wait()  # both have read this call's shares
            return summed

        rows = halves[rank]
        results[rank], _ = reinforce_pp_advantages(
            scores[rows], kl[rows], mask[rows], 0.05, sum_over_processes=all_reduce_sum
        )

    threads = [threading.Thread(target=process, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    torch.testing.assert_close(torch.cat(results), whole)


def test_token_level_losses_take_one_advantage_per_token():
    """The clipped surrogate with advantages [B, C] equals the per-token formula; with [B] it is unchanged."""
    logprobs = torch.log(torch.tensor([[0.6, 0.3], [0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.4, 0.4], [0.5, 0.5]]))  # ratios 1.5, 0.75, 1, 1
    advantages = torch.tensor([[1.0, -1.0], [2.0, -2.0]])
    mask = torch.ones(2, 2)
    bnpo = POLICY_LOSSES["bnpo"].from_config(
        SimpleNamespace(cliprange=0.2, cliprange_high=None, delta=None, importance_sampling_level="token")
    )
    loss, _ = bnpo(logprobs, old, advantages, mask)
    # -min(1.5, 1.2) = -1.2; -min(-0.75, -0.8) = 0.8; -2; 2 -> mean over 4 tokens
    torch.testing.assert_close(loss, torch.tensor((-1.2 + 0.8 - 2.0 + 2.0) / 4))
    sequence, _ = bnpo(logprobs, old, torch.tensor([1.0, 2.0]), mask)
    per_token, _ = bnpo(logprobs, old, torch.tensor([[1.0, 1.0], [2.0, 2.0]]), mask)
    torch.testing.assert_close(sequence, per_token)
