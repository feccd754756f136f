"""How a scored rollout becomes advantages: tensors in, tensors out, no trainer needed.

Shapes: N samples = P prompts x k samples each, C completion tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .logprobs import kl_penalty, last_token_index
from .masked import SumOverProcesses, masked_moments, masked_whiten


def leave_one_out_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """RLOO (Ahmadian et al., 2024): each sample's reward [N] minus the mean reward of the other k - 1 samples
    of its prompt. Samples of one prompt are consecutive."""
    grouped = rewards.view(-1, k)  # [P, k]
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (k - 1)
    return (grouped - baseline).flatten()


SCALE_REWARDS = ("group", "batch", "none")


def group_relative_advantages(
    rewards: torch.Tensor, k: int, scale: str = "group", batch_std: torch.Tensor | None = None
) -> torch.Tensor:
    """GRPO (Shao et al., 2024): each sample's reward [N] minus the mean reward of its prompt's k samples, divided
    by the std (unbiased, + 1e-4) of its group (``"group"``), of the whole batch (``"batch"``: ``batch_std``, e.g.
    every process's, else ``rewards``' own) or not at all (``"none"``, Dr. GRPO). Samples of a prompt are
    consecutive."""
    grouped = rewards.view(-1, k)  # [P, k]
    centred = (grouped - grouped.mean(1, keepdim=True)).flatten()
    if scale == "none":
        return centred
    if scale == "group":
        std = grouped.std(1).repeat_interleave(k)
    else:
        std = rewards.std() if batch_std is None else batch_std
    return centred / (std + 1e-4)


def group_normalized_total(scores: torch.Tensor, weights: torch.Tensor, k: int) -> torch.Tensor:
    """[N] GRPO's ``normalize_then_sum`` (GDPO, arXiv 2601.05242) of scores [N, R] of R reward functions: each
    reward centred and scaled within its group of k consecutive samples, then weighted by ``weights`` [R] and summed;
    the trainer then whitens the total over the batch (``whiten(..., eps=1e-4)``). As TRL's: the mean and (unbiased)
    std of a group leave out the samples a function returned None (NaN) for, and the sum leaves out what stays NaN
    (a None, or a function that applied to one sample of the group only, whose std is undefined)."""
    grouped = scores.view(-1, k, scores.shape[1])  # [P, k, R]
    mean = grouped.nanmean(1, keepdim=True)
    count = (~grouped.isnan()).sum(1, keepdim=True)
    variance = ((grouped - mean) ** 2).nansum(1, keepdim=True) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, variance.sqrt(), torch.full_like(variance, math.nan))
    normalized = ((grouped - mean) / (std + 1e-4)).flatten(0, 1)  # [N, R]
    return (normalized * weights.to(normalized.device)).nansum(1)


def zero_std_groups(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """[P] bool: every sample of the prompt got the same reward (no learning signal in a group baseline)."""
    grouped = rewards.view(-1, k)
    return (grouped == grouped[:, :1]).all(1)


def whiten(
    values: torch.Tensor, moments: tuple[torch.Tensor, torch.Tensor] | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """(values - mean) / (std + eps) over all entries. ``moments``: the (mean, unbiased variance) to use instead of
    ``values``' own (e.g. ``masked_moments`` of every process's values)."""
    mean, std = (values.mean(), values.std()) if moments is None else (moments[0], moments[1].sqrt())
    return (values - mean) / (std + eps)


def shaped_token_rewards(
    scores: torch.Tensor,  # [N] one score per sequence
    token_kl: torch.Tensor,  # [N, C] per-token KL estimate, zero on padding
    kl_coef: float,
    mask: torch.Tensor,  # [N, C]
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token rewards (Ziegler et al., 2019): r_t = -kl_coef * KL_t, plus the sequence score at the
    last completion token. Returns ``(rewards, non_score_rewards)``, both [N, C]."""
    non_score_rewards = -kl_coef * token_kl
    rows = torch.arange(len(scores), device=scores.device)
    rewards = non_score_rewards.clone()
    rewards[rows, last_token_index(mask)] += scores
    return rewards, non_score_rewards


REINFORCE_PP_ESTIMATORS = ("reinforce", "reinforce_baseline")  # OpenRLHF's advantage_estimator names
KL_ESTIMATORS = ("k1", "k2", "k3")


def approx_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """[N, C] per-token estimate of KL(pi || pi_ref) from samples of pi, clamped to [-10, 10] as OpenRLHF's
    ``compute_approx_kl``: Schulman's k1 (log r), k2 ((log r)^2 / 2) or k3 (r - 1 - log r with r = pi_ref / pi)."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={estimator!r} is invalid: use one of {', '.join(KL_ESTIMATORS)}.")
    if estimator == "k2":
        return ((logprobs - ref_logprobs) ** 2 / 2).clamp(-10, 10)
    return kl_penalty(logprobs, ref_logprobs, estimator).clamp(-10, 10)


def kl_penalised_rewards(
    scores: torch.Tensor, token_kl: torch.Tensor, kl_coef: float, mask: torch.Tensor
) -> torch.Tensor:
    """[N, C] per-token rewards r_t = -kl_coef KL_t on the tokens of ``mask`` [N, C], plus each score [N] at its
    sequence's last token of ``mask`` (OpenRLHF's ``compute_reward``; a mask with holes, a multi-turn one, too)."""
    mask = mask.to(token_kl.dtype)
    rewards = -kl_coef * token_kl * mask
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)  # [N] the last 1 of each row
    rewards[torch.arange(len(scores), device=scores.device), last] += scores.to(rewards.dtype)
    return rewards


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """[N, C] REINFORCE's return at each completion token, G_t = r_t + gamma G_{t+1}, from per-token rewards [N, C];
    rewards outside ``mask`` [N, C] count as 0 (OpenRLHF's ``get_cumulative_returns``)."""
    rewards = rewards * mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def reinforce_pp_advantages(
    scores: torch.Tensor,  # [N] one score per sequence
    token_kl: torch.Tensor,  # [N, C] per-token KL estimate (approx_kl); zeros without a KL penalty
    mask: torch.Tensor,  # [N, C] 1 on the tokens the policy sampled
    kl_coef: float,
    gamma: float = 1.0,
    group_size: int | None = None,
    std_norm: bool = True,
    sum_over_processes: SumOverProcesses | None = None,
    clip: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu, 2025, arXiv 2501.03262), as OpenRLHF's ``advantage_estimator="reinforce"``: per-token
    rewards r_t = -kl_coef KL_t plus the score at the last completion token, their discounted returns G_t, whitened
    over every completion token of the whole batch (every process's with ``sum_over_processes``; ``std_norm=False``:
    centred only). With ``group_size`` k (``"reinforce_baseline"``) each score first loses the mean score of its
    prompt's k consecutive samples; then it is clamped to ``clip`` (min, max) if given. Returns ``(advantages,
    returns)``, both [N, C], zero outside ``mask``.

    The variance is the unbiased one, as verl's ``masked_whiten``; OpenRLHF's divides by the token count n instead,
    which makes its advantages sqrt(n / (n - 1)) times these."""
    if group_size is not None:
        scores = group_relative_advantages(scores, group_size, scale="none")
    if clip is not None:
        scores = scores.clamp(*clip)
    mask = mask.to(token_kl.dtype)
    returns = discounted_returns(kl_penalised_rewards(scores, token_kl, kl_coef, mask), mask, gamma) * mask
    mean, var = masked_moments(returns, mask, sum_over_processes)
    if not std_norm:
        return (returns - mean) * mask, returns
    return masked_whiten(returns, mask, (mean, var)), returns


@dataclass(frozen=True)
class RunningMoments:
    """Mean and (population) variance of every value seen so far, for normalising scores over a whole run."""

    mean: float = 0.0
    var: float = 1.0
    count: int = 0

    def updated(self, values: torch.Tensor) -> RunningMoments:
        """The moments after also seeing ``values`` (Chan et al.'s parallel update, in float64)."""
        n, mean, var = values.numel(), values.double().mean().item(), values.double().var(unbiased=False).item()
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta**2 * self.count * n / total
        return RunningMoments(self.mean + delta * n / total, m2 / total, total)

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        return (values - self.mean) / (self.var**0.5 + 1e-8)

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    @classmethod
    def from_state_dict(cls, state: dict) -> RunningMoments:
        return cls(state["mean"], state["var"], state["count"])


def adaptive_kl_coef(kl_coef: float, observed_kl: float, target_kl: float, num_samples: int, horizon: int) -> float:
    """Adaptive KL control (Ziegler et al., 2019): move ``kl_coef`` towards keeping the mean sequence KL at
    ``target_kl``, by at most 20% x num_samples / horizon per update."""
    error = min(max(observed_kl / target_kl - 1, -0.2), 0.2)
    return kl_coef * (1 + error * num_samples / horizon)


def generalized_advantage_estimation(
    rewards: torch.Tensor,  # [N, C] per-token rewards
    values: torch.Tensor,  # [N, C] V(s_t), the value before completion token t
    mask: torch.Tensor,  # [N, C] 1 on completion tokens
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al., 2016): A_t = sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t.

    The value after the last token is 0 (the episode ends). Returns ``(advantages, returns)``, both [N, C],
    zero on padding; returns = advantages + values are the critic's regression targets.
    """
    mask = mask.to(values.dtype)
    values, rewards = values * mask, rewards * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def chosen_first_order(scores: torch.Tensor) -> torch.Tensor:
    """Online DPO: the row permutation [N] that puts each pair (rows 2i, 2i + 1) in (chosen, rejected) order, the
    higher score first; a tie keeps the sampled order."""
    pairs = scores.view(-1, 2)  # [P, 2]
    chosen = 2 * torch.arange(len(pairs), device=scores.device) + (pairs[:, 1] > pairs[:, 0]).long()
    return torch.stack([chosen, chosen ^ 1], dim=1).flatten()  # 2i + 1 ^ 1 = 2i: the partner


def pair_ties(scores: torch.Tensor) -> torch.Tensor:
    """[P] bool: the pair's two completions score the same."""
    pairs = scores.view(-1, 2)
    return pairs[:, 0] == pairs[:, 1]


def pair_weights(ties: torch.Tensor, tie_rule: str) -> torch.Tensor:
    """[N] weight of each row's pair in the loss: 0 for a tie under ``tie_rule="skip"``, else 1."""
    weight = torch.ones_like(ties, dtype=torch.float32) if tie_rule == "first" else (~ties).float()
    return weight.repeat_interleave(2)
