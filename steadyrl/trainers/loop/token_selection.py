"""GRPO's token-selection part: which tokens the policy loss trains on (entropy masking, off-policy sequence masking)
and its entropy bonus, fixed or adaptive. Its fields: config/token_selection.py; the math: ops/token_selection.py."""

from __future__ import annotations

import math

import torch

from ...ops.token_selection import (
    EntropyControl,
    adaptive_entropy_coef,
    entropy_bonus,
    high_entropy_mask,
    off_policy_mask,
)
from ...rollout import Rollout
from .algorithm import Processes


class EntropyCoefficient:
    """The entropy bonus's coefficient and the mean entropy of the last optimizer step (None before the first), as
    ``use_adaptive_entropy`` changes them: part of GRPO's checkpointed algorithm state."""

    def __init__(self, coef: float) -> None:
        self.coef, self.last_entropy = coef, None

    def applied(self, args) -> float:
        """The coefficient every micro-batch of this step applies: with ``use_adaptive_entropy`` only once the last
        step's entropy is at or below ``entropy_target``."""
        if not args.use_adaptive_entropy:
            return self.coef
        return self.coef if self.last_entropy is not None and self.last_entropy <= args.entropy_target else 0.0

    def state_dict(self) -> dict:
        return {"entropy_coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict) -> None:
        self.coef = state.get("entropy_coef", self.coef)
        self.last_entropy = state.get("last_entropy")


class TokenSelection:
    """The masks a micro-batch's policy loss is multiplied by, and the entropy bonus with its coefficient (``state``:
    an ``EntropyCoefficient``, checkpointed with the algorithm).

    Args:
        args: a config with ``TokenSelectionOptions`` (GRPOConfig).
        processes: the collectives (the entropy quantile and the adaptive coefficient are over every process).

    Example::

        selection = TokenSelection(GRPOConfig(output_dir="out", top_entropy_quantile=0.2), Processes(accelerator))
        keep, selected = selection.selected_tokens(logprobs, entropy, batch, mask)
    """

    def __init__(self, args, processes: Processes) -> None:
        self.args, self.processes, self.bonus_on = args, processes, args.entropy_bonus_on
        self.state = EntropyCoefficient(args.entropy_coef)
        self.step_entropy: torch.Tensor | None = None  # [2]: entropy sum and tokens over this step's micro-batches

    @property
    def reads_engine_logprobs(self) -> bool:
        return self.args.off_policy_mask_threshold is not None

    def selected_tokens(
        self, logprobs: torch.Tensor, entropy: torch.Tensor, batch: Rollout, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """What the per-token policy loss is multiplied by ([B, C], or None: every token), and the tokens [B, C] the
        entropy bonus averages over (the loss mask, less the entropy mask's zeros)."""
        args, keep, selected = self.args, None, mask
        if args.off_policy_mask_threshold is not None:
            sampled = batch.engine_logprobs if batch.engine_logprobs is not None else batch.old_logprobs
            sampled = logprobs.detach() if sampled is None else sampled  # trained once: the sampling policy's own
            keep = off_policy_mask(batch.advantages, logprobs, sampled, mask, args.off_policy_mask_threshold)
        if args.top_entropy_quantile < 1.0:
            pooled = self.processes.pooled(entropy.detach()[mask.bool()].float())
            high = high_entropy_mask(entropy.detach(), mask, 1 - args.top_entropy_quantile, pooled).to(mask.dtype)
            keep, selected = (high if keep is None else keep * high), mask * high
        return keep, selected

    def with_entropy_bonus(
        self, training: bool, loss: torch.Tensor, entropy: torch.Tensor, selected: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``loss`` less the entropy bonus (``entropy_coef``), and the policy loss alone as a metric; ``loss``
        unchanged without one. In ``training``, the step's entropy over the trained tokens is summed for the
        adaptive coefficient."""
        if not self.bonus_on:
            return loss, {}
        if training:
            sums = torch.stack([(entropy.detach() * selected).sum(), selected.sum()]).double()
            self.step_entropy = sums if self.step_entropy is None else self.step_entropy + sums
        coef = self.state.applied(self.args)
        return loss - coef * entropy_bonus(entropy, selected), {"policy_loss": loss.item()}

    def begin_step(self) -> None:
        self.step_entropy = None

    def end_step(self, refused: dict[str, str]) -> dict[str, float]:
        """(``use_adaptive_entropy``) the coefficient for the next step; ``entropy_coef`` logged with any bonus."""
        if self.args.use_adaptive_entropy:
            self.update_coefficient(refused)
        return {"entropy_coef": self.state.coef} if self.bonus_on else {}

    def update_coefficient(self, refused: dict[str, str]) -> None:
        """The adaptive coefficient from the step's mean entropy over every process's trained tokens."""
        if self.step_entropy is None:
            return
        args, state, total = self.args, self.state, self.processes.sum
        window = self.step_entropy if total is None else total(self.step_entropy)
        entropy = (window[0] / window[1].clamp(min=1.0)).item()
        self.step_entropy = None
        if refused or not math.isfinite(entropy):  # a skipped step moves nothing, this neither
            return
        control = EntropyControl(
            args.entropy_coef_min, args.entropy_coef_max, args.entropy_coef_delta, args.entropy_target
        )
        state.coef, state.last_entropy = adaptive_entropy_coef(state.coef, entropy, control), entropy
