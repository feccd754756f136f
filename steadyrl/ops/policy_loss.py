"""The policy objectives of TRL's ``loss_type`` family (GRPO, RLOO, REINFORCE++): each a per-token loss that owns its
hyperparameters; loss_registry.py pairs each with an aggregation (aggregations.py) under TRL's names.

Shapes: B sequences in a micro-batch, C completion tokens. An objective's loss is [B, C], or [B, 1] with one
importance weight per sequence; the aggregations multiply it by the [B, C] loss mask either way. Advantages are one
per sequence [B], or one per token [B, C] (REINFORCE++) for the objectives that ``take_token_advantages``.

    w = pi / pi_old            per token ("token"), or exp(mean log-ratio of the sequence) ("sequence", GSPO)
    ClippedSurrogate  l = -min(w A, clip(w, 1 - eps, 1 + eps_high) A)   with ``delta``: w capped at delta first
    SequenceRatio     l = the same with w = exp(sum of the sequence's token log-ratios), one per sequence (TRL's RLOO)
    CISPO             l = -sg(min(w, eps_high)) A log pi                                 (MiniMax, 2025)
    SAPO              l = -sigmoid(tau (w - 1)) 4 / tau A, tau = tau_pos if A > 0 else tau_neg  (arXiv 2511.20347)
    VESPO             l = -sg(phi(W)) A log pi, phi(W) = e^lam W^k e^(-lam W), W the sequence's   (arXiv 2602.10693)
                      product of token ratios (times vLLM's, folded in); k, lam by the advantage's sign

An objective is built once from a config (``from_config`` reads its hyperparameters) and refuses the config's bad
values in ``check(config)``; PPO's two (ppo_loss.py) are built the same way.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar, NamedTuple

import torch

from .masked import masked_mean

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
ENGINE_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
TOKEN_OPTIONS = frozenset({"importance_sampling_level", "delta", "vllm_importance_sampling_correction"})


class TokenLoss(NamedTuple):
    """An objective's result for one micro-batch."""

    loss: torch.Tensor  # [B, C], or [B, 1]: one term per sequence
    log_weights: torch.Tensor  # [B, C] or [B, 1]: log(pi / pi_old), by which GRPO's KL term is bias-corrected
    flags: dict[str, torch.Tensor]  # bool, [B, C]-broadcastable: where a clip binds; logged as shares of loss tokens


def importance_log_weights(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """log(pi / pi_old): [B, C] per token, or [B, 1] the mean over the sequence's tokens (GSPO's ``sequence``)."""
    log_ratio = logprobs - old_logprobs
    if level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def clipped_surrogate(
    log_weights: torch.Tensor,  # [B, C] or [B, 1]
    advantages: torch.Tensor,  # [B, 1] or [B, C]
    cliprange: float,
    cliprange_high: float | None = None,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate per token, -min(w A, clip(w, 1 - eps, 1 + eps_high) A), w = exp(log_weights); with
    ``delta`` the unclipped w is capped at ``delta`` too. Returns the loss and [B, C]-broadcastable bool masks of
    where the clip binds: ``low`` (w < 1 - eps, A < 0), ``high`` (w > 1 + eps_high, A > 0)."""
    high = cliprange if cliprange_high is None else cliprange_high
    weights = torch.exp(log_weights)
    clipped = weights.clamp(1 - cliprange, 1 + high)
    capped = weights if delta is None else weights.clamp(max=delta)
    loss = -torch.min(capped * advantages, clipped * advantages)
    bound = {"low": (weights < 1 - cliprange) & (advantages < 0), "high": (weights > 1 + high) & (advantages > 0)}
    return loss, bound


def advantage_columns(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages as a [B, C]-broadcastable tensor: one per sequence [B] as [B, 1], one per token [B, C] as it is."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def flag_share(where: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of the loss tokens ``mask`` [B, C] where ``where`` ([B, C], [B, 1] or [B]) holds."""
    where = where.expand(mask.shape) if where.dim() == 2 else where.unsqueeze(-1).expand(mask.shape)
    return masked_mean(where.float(), mask.float()).item()


def clip_metrics(bound: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """Shares of the loss tokens where the clip binds: ``clip_ratio/low_mean``, ``/high_mean``, ``/region_mean``
    (TRL's names) and ``clip_ratio`` (the region's, steadyrl's name)."""
    region = flag_share(bound["low"] | bound["high"], mask)
    return {
        "clip_ratio/low_mean": flag_share(bound["low"], mask),
        "clip_ratio/high_mean": flag_share(bound["high"], mask),
        "clip_ratio/region_mean": region,
        "clip_ratio": region,
    }


def engine_importance_weights(
    logprobs: torch.Tensor,  # [N, C] the trainer's, of the sampling policy
    engine_logprobs: torch.Tensor,  # [N, C] the generation engine's (vLLM), of the same tokens
    mask: torch.Tensor,  # [N, C]
    mode: str,
    clip_max: float | None,
    clip_min: float | None = None,
) -> torch.Tensor:
    """Truncated (or masked) importance sampling for the engine/trainer mismatch (Yao et al., 2025; TRL's
    ``vllm_importance_sampling_correction``): pi_trainer / pi_engine per token [N, C] or per sequence [N, 1];
    ``*_truncate`` clamps it into [clip_min, clip_max], ``*_mask`` sets it to 0 outside."""
    diff = torch.nan_to_num((logprobs - engine_logprobs) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def importance_ratio_metrics(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Min, mean and max of the engine importance weights [N, C] or [N, 1] over the loss tokens ``mask`` [N, C]
    (TRL's ``sampling/importance_sampling_ratio/*``); none where there is no loss token."""
    values = weights.expand(mask.shape)[mask.bool()] if weights.shape[1] > 1 else weights.flatten()
    if not values.numel():
        return {}
    name = "sampling/importance_sampling_ratio"
    return {
        f"{name}/min": values.min().item(),
        f"{name}/mean": values.mean().item(),
        f"{name}/max": values.max().item(),
    }


def finite_number(value) -> bool:
    """A real number, not a bool, neither infinite nor NaN (the check of a loss's float hyperparameter)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def clip_high(config) -> float:
    """The config's upper clip epsilon: ``cliprange_high`` (TRL's ``epsilon_high``), else ``cliprange``."""
    return config.cliprange if config.cliprange_high is None else config.cliprange_high


# ---- objectives ----------------------------------------------------------------------------------------------------


class PolicyLoss(abc.ABC):
    """A per-token policy objective that owns its hyperparameters (constructor arguments; ``from_config`` reads them
    from a config, ``check(config)`` refuses bad values there): log-probs [B, C] of the policy being trained, of the
    one that sampled (``old_logprobs`` [B, C]), advantages [B] (one per sequence; [B, C] where
    ``takes_token_advantages``) and the loss mask [B, C] in; a ``TokenLoss`` out. ``reads``: which of the
    token-level options (``TOKEN_OPTIONS``) it honours; the config refuses the others. ``metrics`` turns its flags
    into logged numbers.

    Args (of ``__call__``):
        logprobs: [B, C] under the policy being trained (with gradients).
        old_logprobs: [B, C] under the policy that sampled.
        advantages: [B] one per sequence, or [B, C] one per token (``takes_token_advantages``).
        mask: [B, C] the tokens the loss counts.

    Example::

        out = ClippedSurrogate(cliprange=0.2, cliprange_high=0.28)(logprobs, old_logprobs, advantages, mask)
        out.loss.shape  # [B, C]
    """

    description: ClassVar[str] = ""
    reads: ClassVar[frozenset[str]] = TOKEN_OPTIONS
    # takes the vLLM correction's weights (``engine_weights=``) into its own objective, instead of the loss being
    # multiplied by them afterwards
    folds_engine_weights: ClassVar[bool] = False
    # accepts one advantage per token [B, C] (REINFORCE++'s returns) as well as one per sequence
    takes_token_advantages: ClassVar[bool] = True

    @classmethod
    def from_config(cls, config) -> PolicyLoss:
        """The objective with the config's values of its hyperparameters (it has none: ``cls()``)."""
        return cls()

    @classmethod
    def check(cls, config) -> None:
        """Refuse, with a ValueError naming the field, the value, and what is valid, a config value this objective
        cannot use; called by a config whose ``loss_type`` picks it. (Most have nothing of their own to refuse.)"""
        return None

    @abc.abstractmethod
    def __call__(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> TokenLoss:
        """The objective's per-token loss, its log importance weights and its flags."""

    def metrics(self, flags: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
        """Each flag's share of the loss tokens, under its name."""
        return {name: flag_share(where, mask) for name, where in flags.items()}


class ClippedSurrogate(PolicyLoss):
    """PPO's clipped surrogate (Schulman et al., 2017) with clip-higher (``cliprange_high``, Yu et al., 2025), per
    token or per sequence (``importance_sampling_level="sequence"``, GSPO: Zheng et al., 2025), and ``delta``'s
    two-sided clipping (INTELLECT-2, Prime Intellect, 2025)."""

    description = "the clipped surrogate"

    def __init__(
        self,
        cliprange: float = 0.2,
        cliprange_high: float | None = None,
        delta: float | None = None,
        importance_sampling_level: str = "token",
    ) -> None:
        self.cliprange, self.cliprange_high = cliprange, cliprange_high
        self.delta, self.importance_sampling_level = delta, importance_sampling_level

    @classmethod
    def from_config(cls, config) -> ClippedSurrogate:
        return cls(config.cliprange, config.cliprange_high, config.delta, config.importance_sampling_level)

    def __call__(self, logprobs, old_logprobs, advantages, mask):
        log_weights = importance_log_weights(logprobs, old_logprobs, mask, self.importance_sampling_level)
        loss, bound = clipped_surrogate(
            log_weights, advantage_columns(advantages), self.cliprange, self.cliprange_high, self.delta
        )
        return TokenLoss(loss, log_weights, bound)

    def metrics(self, flags, mask):
        return clip_metrics(flags, mask)


class SequenceRatio(ClippedSurrogate):
    """TRL's RLOO loss (Ahmadian et al., 2024): the clipped surrogate of one importance ratio per sequence,
    exp of its summed token log-ratios; [B, 1]."""

    description = "TRL's RLOO loss, one importance ratio per sequence"
    reads = frozenset()
    takes_token_advantages = False

    @classmethod
    def from_config(cls, config) -> SequenceRatio:
        return cls(config.cliprange, config.cliprange_high)

    def __call__(self, logprobs, old_logprobs, advantages, mask):
        mask = mask.to(logprobs.dtype)
        log_ratio = ((logprobs - old_logprobs) * mask).sum(1, keepdim=True)  # [B, 1]
        loss, bound = clipped_surrogate(log_ratio, advantages.unsqueeze(1), self.cliprange, self.cliprange_high)
        return TokenLoss(loss, log_ratio, bound)


class CISPO(PolicyLoss):
    """CISPO (MiniMax-M1: MiniMax, 2025), as TRL's ``loss_type="cispo"``: REINFORCE weighted by the importance weight
    clipped from above and detached, l = -sg(min(w, eps_max)) A log pi, w per token or per sequence. eps_max is
    ``cliprange_high`` (TRL's ``epsilon_high``; default ``cliprange``) as a bound on w itself, not on w - 1: ScaleRL
    (Khatri et al., 2025) recommends 5.0. Logged: ``cispo_clip_ratio``, the share of tokens with w > eps_max, A > 0."""

    description = "CISPO: -min(w, epsilon_high) x A x log-prob, the weight detached"
    reads = frozenset({"importance_sampling_level", "vllm_importance_sampling_correction"})

    def __init__(self, weight_max: float = 0.2, importance_sampling_level: str = "token") -> None:
        self.weight_max, self.importance_sampling_level = weight_max, importance_sampling_level

    @classmethod
    def from_config(cls, config) -> CISPO:
        return cls(clip_high(config), config.importance_sampling_level)

    def __call__(self, logprobs, old_logprobs, advantages, mask):
        log_weights = importance_log_weights(logprobs, old_logprobs, mask, self.importance_sampling_level)
        weights, advantages = torch.exp(log_weights), advantage_columns(advantages)  # [B, C] or [B, 1] each
        loss = -weights.clamp(max=self.weight_max).detach() * advantages * logprobs  # [B, C]
        return TokenLoss(loss, log_weights, {"cispo_clip_ratio": (weights > self.weight_max) & (advantages > 0)})


class SAPO(PolicyLoss):
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347, 2025), as TRL's ``loss_type="sapo"``: a smooth gate
    in place of the hard clip, l = -sigmoid(tau (w - 1)) x 4 / tau x A, whose gradient in w is A at w = 1 and fades
    as w leaves it; tau is ``temperature_pos`` (``sapo_temperature_pos``) where A > 0, ``temperature_neg``
    (``sapo_temperature_neg``) elsewhere (a higher one fades faster), w per token or per sequence."""

    description = "SAPO: -sigmoid(tau x (w - 1)) x 4 / tau x A, tau by the advantage's sign"
    reads = frozenset({"importance_sampling_level", "vllm_importance_sampling_correction"})

    def __init__(
        self, temperature_pos: float = 1.0, temperature_neg: float = 1.05, importance_sampling_level: str = "token"
    ) -> None:
        self.temperature_pos, self.temperature_neg = temperature_pos, temperature_neg
        self.importance_sampling_level = importance_sampling_level

    @classmethod
    def from_config(cls, config) -> SAPO:
        return cls(config.sapo_temperature_pos, config.sapo_temperature_neg, config.importance_sampling_level)

    @classmethod
    def check(cls, config) -> None:
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            value = getattr(config, name)
            if not (finite_number(value) and value > 0):
                raise ValueError(f"{name}={value!r} is invalid: SAPO's gate temperature must be a finite number > 0.")

    def __call__(self, logprobs, old_logprobs, advantages, mask):
        log_weights = importance_log_weights(logprobs, old_logprobs, mask, self.importance_sampling_level)
        advantages = advantage_columns(advantages)  # [B, 1] or [B, C]
        tau = torch.where(advantages > 0, self.temperature_pos, self.temperature_neg)
        loss = -torch.sigmoid(tau * (torch.exp(log_weights) - 1)) * 4 / tau * advantages
        return TokenLoss(loss, log_weights, {})


LOG_FLOOR = math.log(1e-8)  # VESPO's bounds on log-weights, as in its reference implementation


@torch.no_grad()
def gamma_weights(
    advantages: torch.Tensor,  # [B, 1]
    log_ratio: torch.Tensor,  # [B, C] log(pi / pi_old) per token
    mask: torch.Tensor,  # [B, C]
    engine_weights: torch.Tensor | None,  # [B, C]: pi_old / pi_vLLM per token (truncated or masked), or None
    k: tuple[float, float],  # the shape where A >= 0, where A < 0
    lam: tuple[float, float],  # the rate where A >= 0, where A < 0
) -> torch.Tensor:
    """VESPO's sequence weights phi(W) [B, 1] = e^lam W^k e^(-lam W) (so phi(1) = 1), in log space, detached: W is
    the sequence's product of its token ratios, times vLLM's, each log bounded as in the reference code."""
    log_w = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True)
    if engine_weights is not None:
        log_w = log_w + torch.log(engine_weights).clamp(LOG_FLOOR, 20.0).sum(-1, keepdim=True)
    log_w = log_w.clamp(LOG_FLOOR, 20.0)
    positive = advantages >= 0
    shape = torch.where(positive, *k)
    rate = torch.where(positive, *lam).clamp(min=1e-4)
    return torch.exp(rate + shape * log_w - rate * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


class VESPO(PolicyLoss):
    """VESPO (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693, 2026), as TRL's
    ``loss_type="vespo"``: REINFORCE scaled by a detached Gamma weight of the sequence's importance weight,
    l = -sg(phi(W)) A log pi, with shape ``k_pos`` / rate ``lambda_pos`` (``vespo_k_pos``, ``vespo_lambda_pos``)
    where A >= 0 and ``_neg`` elsewhere; with the vLLM correction its token weights enter W
    (``folds_engine_weights``), so only the per-token correction modes apply. Logged: ``vespo/phi_seq_mean``."""

    description = "VESPO: -phi(W) x A x log-prob, phi a Gamma weight of the sequence's importance weight, detached"
    reads = frozenset({"vllm_importance_sampling_correction"})
    folds_engine_weights = True
    takes_token_advantages = False  # phi is the sequence's, chosen by the sign of its one advantage
    # vLLM's per-token weights enter W: the correction modes that give them
    engine_modes: ClassVar[tuple[str, ...]] = tuple(m for m in ENGINE_CORRECTION_MODES if m.startswith("token"))

    def __init__(
        self, k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0, lambda_neg: float = 2.0
    ) -> None:
        self.k_pos, self.lambda_pos, self.k_neg, self.lambda_neg = k_pos, lambda_pos, k_neg, lambda_neg

    @classmethod
    def from_config(cls, config) -> VESPO:
        return cls(config.vespo_k_pos, config.vespo_lambda_pos, config.vespo_k_neg, config.vespo_lambda_neg)

    @classmethod
    def check(cls, config) -> None:
        mode = config.vllm_importance_sampling_mode
        if config.vllm_importance_sampling_correction and mode not in cls.engine_modes:
            raise ValueError(
                f"vllm_importance_sampling_mode={mode!r} does not apply to loss_type='vespo': VESPO multiplies "
                "vLLM's per-token weights into its sequence weight, so use "
                f"{' or '.join(repr(mode) for mode in cls.engine_modes)}."
            )

    def __call__(self, logprobs, old_logprobs, advantages, mask, engine_weights=None):
        log_ratio, advantages = logprobs - old_logprobs, advantages.unsqueeze(1)  # [B, C], [B, 1]
        k, lam = (self.k_pos, self.k_neg), (self.lambda_pos, self.lambda_neg)
        phi = gamma_weights(advantages, log_ratio, mask.to(logprobs.dtype), engine_weights, k, lam)  # [B, 1]
        return TokenLoss(-phi * advantages * logprobs, log_ratio, {"vespo/phi_seq_mean": phi})

    def metrics(self, flags, mask):
        phi = flags["vespo/phi_seq_mean"].expand(mask.shape)
        return {"vespo/phi_seq_mean": masked_mean(phi, mask.to(phi.dtype)).item()}
