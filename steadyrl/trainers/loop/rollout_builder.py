"""The rollout builder: a sampled, scored rollout as the typed ``Rollout`` the algorithm reads, with the padded
tokens, each sample's total reward and the log-probs the loss needs besides its own (the sampling policy's, the
reference's), and vLLM's log-probs checked against the trainer's (``engine_check``). Built from its inputs: the
rewards (rollout_rewards.py), the tokenizer, the algorithm, the models.
"""

from __future__ import annotations

import dataclasses

import torch

from ...distributed.placement import offloaded
from ...generation import Generation
from ...ops import (
    batched_logprobs,
    ends_without_eos,
    engine_importance_weights,
    importance_ratio_metrics,
    masked_mean,
    pad_prompts_and_completions,
)
from ...rollout import Rollout, TokenBatch, engine_logprob_tensor, rollout_metrics
from ...vision import ImageBatch
from ..config.policy_loss import PolicyLossOptions
from .algorithm import Algorithm
from .rollout_rewards import RolloutRewards
from .sources import Sampled


class RolloutBuilder:
    """A scored rollout as a ``Rollout``, with the passes over it before training: the sampling policy's log-probs where
    the loss needs them
    apart from its own pass (``needs_old_logprobs``), the reference's where a KL term reads them, and the check of
    vLLM's log-probs (``engine_check``).

    Args:
        args: the config (micro_rollout_batch_size, pad_to_multiple_of, packing, vLLM's correction settings).
        tokenizer: the policy's (pad and EOS ids).
        device: where the rollout's tensors go.
        algorithm: the facts it asks (``needs_old_logprobs``, ``logprob_temperature``, ...).
        rewards: the rollout's rewards (their names and each sample's total).
        policy: the policy model (the actor, unwrapped).
        reference: the frozen reference, or None: under PEFT the policy with its adapters disabled; with
            ``uses_reference`` False no reference pass runs.
        offload_reference: move the reference to the device for its pass only (``ref_reward_offload``).

    Example::

        build = RolloutBuilder(args, tokenizer, device, algorithm, rewards, model, ref_model, True, False)
        rollout, metrics = build(sampled, scores, {})
    """

    def __init__(
        self,
        args,
        tokenizer,
        device: torch.device,
        algorithm: Algorithm,
        rewards: RolloutRewards,
        policy: torch.nn.Module,
        reference: torch.nn.Module | None,
        uses_reference: bool,
        offload_reference: bool,
    ) -> None:
        self.args, self.tokenizer, self.device, self.algorithm, self.rewards = (
            args,
            tokenizer,
            device,
            algorithm,
            rewards,
        )
        self.policy, self.reference = policy, reference
        self.uses_reference, self.offload_reference = uses_reference, offload_reference

    @torch.no_grad()
    def __call__(self, sampled: Sampled, scores: torch.Tensor, metrics: dict) -> tuple[Rollout, dict[str, float]]:
        """The padded ``Rollout`` [N, P + C] of ``sampled`` with its scores [N, num_rewards], and its metrics."""
        generation, args = sampled.generation, self.args
        engine = generation.logprobs is not None
        rollout = self.padded(sampled.prompt_ids, generation.completion_ids, scores, engine, generation)
        if sampled.prompt_index is not None:
            index = torch.tensor(sampled.prompt_index, dtype=torch.long, device=rollout.scores.device)
            rollout = dataclasses.replace(rollout, prompt_index=index)
        metrics = {**rollout_metrics(rollout, scores, self.rewards.names, sampled.generation_time), **metrics}
        if engine:  # health of the weight sync (and the correction): engine vs trainer
            engine_logprobs = engine_logprob_tensor(generation.logprobs, rollout.completion_mask.float())
            if rollout.old_logprobs is None or self.algorithm.reads_engine_logprobs:  # trained once: the training
                rollout = dataclasses.replace(rollout, engine_logprobs=engine_logprobs)  # pass's log-probs check them
            if rollout.old_logprobs is not None:
                weights, checked = engine_check(args, rollout.old_logprobs, engine_logprobs, rollout.policy_mask)
                rollout, metrics = dataclasses.replace(rollout, engine_weights=weights), {**metrics, **checked}
        return rollout, metrics

    def padded(self, prompt_ids, completion_ids, scores, engine: bool, generation: Generation) -> Rollout:
        args, tok, device, algorithm = self.args, self.tokenizer, self.device, self.algorithm
        multiple = args.pad_to_multiple_of  # TRL's: widths a multiple of it, the padding masked
        tokens = TokenBatch(
            **pad_prompts_and_completions(prompt_ids, completion_ids, tok.pad_token_id, device, multiple)
        )
        env_mask = getattr(generation, "env_mask", None)  # multi-turn: the completion tokens the policy sampled
        if env_mask is not None:
            env_mask = pad_prompts_and_completions(prompt_ids, env_mask, 0, device, multiple)["completion_ids"]
        no_eos = ends_without_eos(tokens.completion_ids, tokens.completion_mask, tok.eos_token_id)
        total = self.rewards.total(scores.to(device), no_eos)  # [N]: a None (NaN) score left out
        # vLLM's log-probs are checked against them, here or (a loss that can: ``checks_engine_in_loss``) by the
        # training pass of a rollout trained once
        needed = algorithm.needs_old_logprobs() or (engine and not algorithm.checks_engine_in_loss)
        images = None if generation.images is None else generation.images.to(device)
        old_logprobs = self.policy_logprobs(self.policy, tokens, images) if needed else None
        ref_logprobs = self.reference_logprobs(tokens, images) if self.uses_reference else None
        return Rollout(
            **vars(tokens),
            scores=total,
            reward_scores=scores.to(device),
            ref_logprobs=ref_logprobs,
            old_logprobs=old_logprobs,
            env_mask=env_mask,
            images=images,
        )

    def policy_logprobs(self, model, tokens: TokenBatch, images: ImageBatch | None = None) -> torch.Tensor:
        """[N, C] log-probs of the completion tokens under ``model``, at the algorithm's ``logprob_temperature``, in
        micro-batches of ``micro_rollout_batch_size``; ``images``: the samples' image inputs."""
        args = self.args
        size, multiple, packing = args.micro_rollout_batch_size, args.pad_to_multiple_of, args.packing
        temperature = self.algorithm.logprob_temperature
        return batched_logprobs(model, tokens.token_tensors, temperature, size, multiple, packing, images)

    def reference_logprobs(self, tokens: TokenBatch, images: ImageBatch | None = None) -> torch.Tensor:
        """[N, C] log-probs under the reference: its frozen copy, or under PEFT the actor with adapters disabled."""
        if self.reference is not None:
            with offloaded(self.reference, self.device, self.offload_reference):
                return self.policy_logprobs(self.reference, tokens, images)
        with self.policy.disable_adapter():
            return self.policy_logprobs(self.policy, tokens, images)


def engine_check(
    args, trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """vLLM's log-probs of the sampled tokens against the trainer's [N, C] over ``mask``: their mean absolute
    difference (``generation_logprob_diff``: about 1e-7 in float32 when the engine runs the trainer's weights; more
    means a lag, a broken weight sync or another precision) and, with ``vllm_importance_sampling_correction``, the
    truncated importance weights pi_trainer / pi_vLLM and their min / mean / max (TRL's
    ``sampling/importance_sampling_ratio/*``); None without the correction."""
    metrics = {"generation_logprob_diff": masked_mean((engine_logprobs - trainer_logprobs).abs(), mask).item()}
    if not (isinstance(args, PolicyLossOptions) and args.vllm_importance_sampling_correction):
        return None, metrics
    weights = engine_importance_weights(
        trainer_logprobs,
        engine_logprobs,
        mask,
        args.vllm_importance_sampling_mode,
        args.vllm_importance_sampling_clip_max,
        args.vllm_importance_sampling_clip_min,
    )
    return weights, {**metrics, **importance_ratio_metrics(weights, mask)}
