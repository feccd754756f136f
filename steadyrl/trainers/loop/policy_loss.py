"""The policy-loss part of the algorithms that take TRL's ``loss_type`` family (GRPO, RLOO, REINFORCE++): the loss
``ops.POLICY_LOSSES[loss_type]`` built once from the config (it holds its hyperparameters), with what it reads
besides the log-probs (vLLM's importance weights, a Mixture-of-Experts model's load-balancing loss). Its fields:
config/policy_loss.py."""

from __future__ import annotations

import torch
from transformers.utils import logging

from ...ops import POLICY_LOSSES, completion_logprobs
from ...rollout import Advantages, Rollout
from .algorithm import Algorithm, Processes
from .rollout_builder import engine_check

logger = logging.get_logger(__name__)


def warn_about_loss_setup(args) -> None:
    """TRL's two warnings about a loss setup that does not compute what its paper does, given as TRL gives them: when
    the trainer is built."""
    if args.importance_sampling_level == "sequence" and args.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        logger.warning(
            f"importance_sampling_level='sequence' with loss_type={args.loss_type!r}: the loss sums per-token "
            "contributions, which effectively weights each sequence by its completion length instead of optimizing "
            "the per-sequence objective; GSPO's setup is loss_type='grpo'."
        )
    if args.loss_type == "luspo" and args.importance_sampling_level != "sequence":
        logger.warning(  # the paper's LUSPO weighs whole sequences (GSPO's weights)
            "loss_type='luspo' is meant for importance_sampling_level='sequence' (the paper's setup); with "
            f"importance_sampling_level={args.importance_sampling_level!r} each token has its own weight."
        )


def router_aux_loss(model, coef: float | None) -> tuple[float, bool]:
    """The load-balancing loss's weight (``coef``, or the model config's own) and whether the loss adds it: for a
    Mixture-of-Experts model (one whose config has ``output_router_logits``) with a weight other than 0."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    moe = hasattr(config, "output_router_logits")
    if coef and not moe:
        raise ValueError(
            f"router_aux_loss_coef={coef} is set, but {type(model).__name__} is not a Mixture-of-Experts model that "
            "returns its router logits, so there is no load-balancing loss to weight: leave it unset."
        )
    weight = (getattr(config, "router_aux_loss_coef", 0.0) or 0.0) if coef is None else coef
    return weight, moe and weight != 0.0


class ConfiguredPolicyLoss:
    """``loss_type``'s loss (``ops.POLICY_LOSSES``), built once from the config with GRPO's KL term (``beta``,
    ``use_bias_correction_kl``), and the log-probs it is given.

    Args:
        args: a config with ``PolicyLossOptions`` (GRPOConfig, RLOOConfig, ...).
        policy: the policy model (a Mixture-of-Experts model's load-balancing loss is added with
            ``router_aux_loss_coef``).

    Example::

        loss = ConfiguredPolicyLoss(GRPOConfig(output_dir="out", loss_type="dr_grpo"), model)
        logprobs, entropy, outputs = loss.logprobs(model, batch)
        value, metrics = loss(logprobs, batch, mask)
    """

    def __init__(self, args, policy: torch.nn.Module) -> None:
        warn_about_loss_setup(args)
        self.args = args
        self.loss = POLICY_LOSSES[args.loss_type].from_config(
            args, kl_coef=args.beta, kl_bias_correction=args.use_bias_correction_kl
        )
        self.router_aux_loss_coef, self.aux_loss_enabled = router_aux_loss(policy, args.router_aux_loss_coef)

    @property
    def divides_by_step_tokens(self) -> bool:
        """Whether the aggregation divides each micro-batch by the step's tokens (``dapo``)."""
        return self.loss.aggregation.step_tokens

    def logprobs(self, model, batch: Rollout) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Log-probs and entropies [B, C] of the batch's completions at the sampling temperature, and the model's
        other outputs the loss reads: a Mixture-of-Experts model's ``aux_loss`` where ``aux_loss_enabled``."""
        outputs = {} if self.aux_loss_enabled else None
        logprobs, entropy = completion_logprobs(
            model,
            *batch.token_tensors,
            temperature=self.args.temperature,
            with_entropy=True,
            outputs=outputs,
            packing=self.args.packing,
            images=batch.images,
        )
        return logprobs, entropy, outputs or {}

    def with_aux_loss(self, loss: torch.Tensor, outputs: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """``loss`` plus ``router_aux_loss_coef`` x the load-balancing loss, where the model returned one."""
        if "aux_loss" not in outputs:
            return loss, {}
        return loss + self.router_aux_loss_coef * outputs["aux_loss"], {"aux_loss": outputs["aux_loss"].item()}

    def engine_weights_of(self, logprobs: torch.Tensor, batch: Rollout) -> tuple[torch.Tensor | None, dict]:
        """The batch's vLLM importance weights, and for a rollout trained once (it holds ``engine_logprobs``, no
        separate pass ran) the check and weights from this training pass's own ``logprobs`` [B, C], detached: the
        sampling policy's."""
        if batch.engine_logprobs is None or batch.old_logprobs is not None:  # weighed by the scoring pass
            return batch.engine_weights, {}
        return engine_check(self.args, logprobs.detach(), batch.engine_logprobs, batch.policy_mask)

    def __call__(
        self,
        logprobs: torch.Tensor,
        batch: Rollout,
        mask: torch.Tensor,
        kl: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of ``logprobs`` [B, C] over ``mask`` [B, C] with the batch's advantages (one per sequence),
        weighted by the vLLM importance weights if any and by ``keep`` ([B, C] or [B, 1]: GRPO's token selection),
        plus ``beta`` x ``kl`` [B, C] (GRPO's KL term; with ``use_bias_correction_kl`` weighted by the importance
        ratio), and its metrics."""
        sampled = logprobs.detach() if batch.old_logprobs is None else batch.old_logprobs  # trained once: the same
        engine_weights, engine_metrics = self.engine_weights_of(logprobs, batch)
        normaliser = None if batch.tokens_per_micro_batch is None else batch.tokens_per_micro_batch[0]
        loss, metrics = self.loss(
            logprobs,
            sampled,
            batch.advantages,
            mask,
            engine_weights=engine_weights,
            kl=kl,
            tokens_per_micro_batch=normaliser,
            keep=keep,
        )
        return loss, {**metrics, **engine_metrics}


class PolicyGradient(Algorithm):
    """An algorithm trained with the ``loss_type`` family (GRPO, RLOO, REINFORCE++): it holds ``policy_loss``, checks
    vLLM's log-probs in its own training pass, and reports ``eval_loss`` as TRL's trainers do.

    Args:
        args, processes, eos_token_id: as ``Algorithm``'s.
        policy: the policy model, for ``ConfiguredPolicyLoss``.
    """

    checks_engine_in_loss = True
    evaluates_loss = True

    def __init__(self, args, processes: Processes, eos_token_id: int | None, policy: torch.nn.Module) -> None:
        super().__init__(args, processes, eos_token_id)
        self.policy_loss = ConfiguredPolicyLoss(args, policy)

    def with_step_tokens(self, rollout: Rollout, advantages: torch.Tensor, metrics: dict) -> Advantages:
        """``advantages`` [N] with ``tokens_per_micro_batch`` where the loss's aggregation divides by it (``dapo``)."""
        tokens = self.tokens_per_micro_batch(rollout) if self.policy_loss.divides_by_step_tokens else None
        return Advantages(advantages=advantages, tokens_per_micro_batch=tokens, metrics=metrics)
