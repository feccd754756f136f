"""The rollout stage of the on-policy loop: prompts -> completions -> scores -> a Rollout with the algorithm's
advantages and a mini-batch schedule; evaluation reuses its generation and scoring, and the completion log shows
its samples.

    next_prompts()      this process's share of the rollout's prompts, each n_samples_per_prompt times
    tokenize()          prompt token ids (conversations through the chat template), cut to max_prompt_length
    generate()          one completion per row (HF generate or vLLM), seeded per (rollout, prompt, sample)
    score()             reward functions / reward model / judge on ``reward_inputs()`` -> [N, num_rewards]
    scored_rollout()    padded tokens, weighted scores, reference (and sampling-policy) log-probs
    compute_advantages  the algorithm's part -> Rollout.with_advantages
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time

import torch
from accelerate.utils import gather_object

from ...data.prompts import as_completions, prompt_texts, tokenize_prompts
from ...data.sampling import next_rows
from ...distributed.fsdp import unsharded
from ...distributed.placement import offloaded
from ...distributed.zero import gathered_for_generation
from ...generation import Generation, sampling_seed
from ...ops import (
    batched_logprobs,
    ends_without_eos,
    engine_importance_weights,
    importance_ratio_metrics,
    masked_mean,
    pad_prompts_and_completions,
)
from ...ops.masked import SumOverProcesses
from ...rewards import RewardInputs, reward_func_name, weighted_total
from ...rollout import (
    Rollout,
    RolloutBuffer,
    TokenBatch,
    completion_rows,
    engine_logprob_tensor,
    minibatch_schedule,
    rollout_metrics,
)


class RolloutMixin:
    """Making rollouts for ``OnPolicyTrainer``."""

    @torch.no_grad()
    def make_rollout(self) -> RolloutBuffer:
        """Generate, score and turn one rollout into a buffer with a fixed mini-batch schedule."""
        prompts, columns, seeds = self.draw_rollout()
        start = time.time()
        prompts, prompt_ids, truncated, generation = self.sample_completions(prompts, columns, seeds)
        generation_time = time.time() - start
        scores, metrics = self.score_generation(prompts, prompt_ids, generation, columns)  # [N, num_rewards]
        metrics.update(getattr(generation, "metrics", {}))
        metrics["prompts_truncated"] = truncated / len(prompts)
        return self.finish_rollout(prompt_ids, generation, scores, generation_time, metrics)

    def draw_rollout(self) -> tuple[list, dict[str, list], list[int]]:
        """The next rollout's prompts and columns (this process's share) and one sampling seed per sample."""
        args = self.args
        prompts, columns, first_prompt = self.next_prompts()
        k, rollout = args.n_samples_per_prompt, self.loop.rollouts
        seeds = [sampling_seed(args.seed, rollout, first_prompt + i // k, i % k) for i in range(len(prompts))]
        self.loop.rollouts += 1
        return prompts, columns, seeds

    def finish_rollout(
        self, prompt_ids, generation: Generation, scores: torch.Tensor, generation_time: float, metrics: dict
    ) -> RolloutBuffer:
        """The scored generation as a Rollout with the trainer's passes (reference and sampling-policy log-probs),
        the algorithm's advantages and a mini-batch schedule."""
        args = self.args
        rollout = self.scored_rollout(
            prompt_ids,
            generation.completion_ids,
            scores,
            generation.logprobs is not None,
            getattr(generation, "env_mask", None),
        )
        reward_names = [reward_func_name(func) for func in self.reward_funcs]
        metrics = {**rollout_metrics(rollout, scores, reward_names, generation_time), **metrics}
        if generation.logprobs is not None:  # health of the weight sync (and the correction): engine vs trainer
            engine = engine_logprob_tensor(generation.logprobs, rollout.completion_mask.float())
            if rollout.old_logprobs is None:  # trained once: the training pass's own log-probs check and correct
                rollout = dataclasses.replace(rollout, engine_logprobs=engine)
            else:
                weights, checked = self.engine_check(rollout.old_logprobs, engine, rollout.policy_mask)
                rollout, metrics = dataclasses.replace(rollout, engine_weights=weights), {**metrics, **checked}
        added = self.compute_advantages(rollout)
        rollout, metrics = rollout.with_advantages(added), {**metrics, **added.metrics}
        minibatch = args.train_batch_size // self.accelerator.num_processes
        schedule = minibatch_schedule(len(rollout), minibatch, args.num_ppo_epochs, self.samples_per_group)
        return RolloutBuffer(rollout.to("cpu"), schedule, metrics)

    def next_prompts(self) -> tuple[list[str], dict[str, list], int]:
        """This process's share of the next rollout's prompts, each repeated ``n_samples_per_prompt`` times, the
        dataset's other columns alike, and the index of its first prompt in the whole rollout."""
        args, world = self.args, self.accelerator.num_processes
        per_process = args.rollout_batch_size // world
        first = self.accelerator.process_index * per_process
        part = slice(first, first + per_process)
        rows = next_rows(self.loop.sampler, self.train_dataset, args.rollout_batch_size, part)  # {column: values}
        k = args.n_samples_per_prompt
        return *self.repeated_rows(rows, k), first

    def repeated_rows(self, rows: dict[str, list], k: int) -> tuple[list, dict[str, list]]:
        """The prompts and the other columns of ``rows``, each row repeated ``k`` times (one per sample); with
        ``remove_unused_columns`` no other column."""
        prompts = [p for p in rows.pop("prompt") for _ in range(k)]
        if self.args.remove_unused_columns:
            return prompts, {}
        return prompts, {name: [v for v in values for _ in range(k)] for name, values in rows.items()}

    def tokenize(self, prompts: list) -> list[list[int]]:
        """The token ids the policy sees for each prompt: the text, or the conversation rendered with the chat
        template (``chat_template_kwargs``), before truncation to ``max_prompt_length``."""
        return tokenize_prompts(prompts, self.processing_class, self.conversational, self.args.chat_template_kwargs)

    def score_generation(
        self, prompts: list, prompt_ids, generation: Generation, columns: dict, state=None, tokenizer=None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores [N, num_rewards] of a generation's completions (multi-turn: its conversations and the extra keyword
        arguments) with ``state`` as ``trainer_state``, and the metrics the reward functions logged."""
        inputs = self.reward_inputs(prompts, prompt_ids, generation.completion_ids, columns, tokenizer)
        inputs = dataclasses.replace(inputs, **self.trajectory_fields(generation))
        return self.score(inputs, state), inputs.metric_means()

    def reward_inputs(self, prompts: list, prompt_ids, completion_ids, columns: dict, tokenizer=None) -> RewardInputs:
        """What reward functions and judges see of the completions, in TRL's conventions (decoded with
        ``tokenizer``, default the policy's)."""
        tok, kwargs = tokenizer or self.processing_class, self.args.chat_template_kwargs
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        return RewardInputs(
            prompts=prompts,
            completions=as_completions(texts, self.conversational),
            completion_ids=completion_ids,
            columns=columns,
            prompt_ids=prompt_ids,
            completion_texts=texts,
            prompt_texts=prompt_texts(prompts, tok, self.conversational, kwargs),
        )

    def generate(self, prompt_ids: list[list[int]], seeds: list[int], chunk: int | None = None) -> Generation:
        """One completion per prompt row with the current actor, each sampled with its seed where the backend takes
        seeds; with HF generate in calls of ``chunk`` rows (all at once if None)."""
        actor = self.model
        self.backend.sync_weights(actor, version=self.state.global_step)
        training_model = self.backend.runs_training_model  # HF generate: under ZeRO-3 or FSDP2, gather the actor first
        if not training_model or chunk is None:  # vLLM schedules its own batches: it gets every row at once
            chunk = max(1, len(prompt_ids))
        parts = []
        if self.fsdp_version:
            whole = unsharded(actor, self.accelerator.state.fsdp_plugin.reshard_after_forward)
        else:
            whole = gathered_for_generation(self.model_wrapped)
        with whole if training_model else contextlib.nullcontext():
            for i in range(0, len(prompt_ids), chunk):
                parts.append(self.backend.generate(actor, prompt_ids[i : i + chunk], seeds[i : i + chunk]))
        return Generation.concatenate(parts)

    def scored_rollout(
        self,
        prompt_ids,
        completion_ids,
        scores: torch.Tensor,
        engine_logprobs: bool,
        env_mask: list[list[int]] | None = None,
    ) -> Rollout:
        """The padded rollout with its weighted scores and the log-probs of the scoring passes; ``env_mask``
        (multi-turn) marks the completion tokens the policy sampled."""
        args, tok, device = self.args, self.processing_class, self.accelerator.device
        tokens = TokenBatch(**pad_prompts_and_completions(prompt_ids, completion_ids, tok.pad_token_id, device))
        if env_mask is not None:
            env_mask = pad_prompts_and_completions(prompt_ids, env_mask, 0, device)["completion_ids"]
        total = weighted_total(scores, self.reward_weights).to(device)  # [N]: a None (NaN) score left out
        if args.missing_eos_penalty is not None:
            no_eos = ends_without_eos(tokens.completion_ids, tokens.completion_mask, tok.eos_token_id)
            total = self.penalise_missing_eos(total, no_eos)
        # vLLM's log-probs are checked against them, here or (a loss that can: ``checks_engine_in_loss``) by the
        # training pass of a rollout trained once
        needed = self.needs_old_logprobs() or (engine_logprobs and not self.checks_engine_in_loss)
        old_logprobs = self.policy_logprobs(self.model, tokens) if needed else None
        ref_logprobs = self.reference_logprobs(tokens) if self.uses_reference else None
        return Rollout(
            **vars(tokens),
            scores=total,
            reward_scores=scores.to(device),
            ref_logprobs=ref_logprobs,
            old_logprobs=old_logprobs,
            env_mask=env_mask,
        )

    def engine_check(
        self, trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """vLLM's log-probs of the sampled tokens against the trainer's [N, C] over ``mask``: their mean absolute
        difference (``generation_logprob_diff``: about 1e-7 in float32 when the engine runs the trainer's weights;
        more means a lag, a broken weight sync or another precision) and, with ``vllm_importance_sampling_correction``,
        the truncated importance weights pi_trainer / pi_vLLM and their min / mean / max (TRL's
        ``sampling/importance_sampling_ratio/*``); None without the correction."""
        args = self.args
        metrics = {"generation_logprob_diff": masked_mean((engine_logprobs - trainer_logprobs).abs(), mask).item()}
        if not getattr(args, "vllm_importance_sampling_correction", False):
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

    def penalise_missing_eos(self, total: torch.Tensor, no_eos: torch.Tensor) -> torch.Tensor:
        """The weighted scores [N] less ``missing_eos_penalty`` where a completion ends without EOS [N]."""
        return total - self.args.missing_eos_penalty * no_eos.float()

    def policy_logprobs(self, model, tokens: TokenBatch) -> torch.Tensor:
        """[N, C] log-probs of the completion tokens under ``model``, at ``logprob_temperature``, in micro-batches
        of ``micro_rollout_batch_size``."""
        size = self.args.micro_rollout_batch_size
        return batched_logprobs(model, tokens.token_tensors, self.logprob_temperature, size)

    def reference_logprobs(self, tokens: TokenBatch) -> torch.Tensor:
        """[N, C] log-probs under the reference: its frozen copy, or under PEFT the actor with adapters disabled."""
        if self.ref_model is not None:
            offload = self.args.ref_reward_offload and not self.zero3  # ZeRO-3: the engine offloads
            with offloaded(self.ref_model, self.accelerator.device, offload):
                return self.policy_logprobs(self.ref_model, tokens)
        with self.model.disable_adapter():
            return self.policy_logprobs(self.model, tokens)

    def sum_over_processes(self) -> SumOverProcesses | None:
        """An all-reduce sum over the processes, for statistics of the whole rollout (``masked_moments``); None on
        one process, whose share is the whole rollout."""
        if self.accelerator.num_processes == 1:
            return None
        return functools.partial(self.accelerator.reduce, reduction="sum")

    def sample_advantages(self, rollout: Rollout) -> torch.Tensor | None:
        """One advantage per sample [N] for the completion log: RLOO's as they are, PPO's averaged over the
        completion's tokens; None for an algorithm without advantages."""
        if rollout.advantages is None:
            return None
        if rollout.advantages.dim() == 1:
            return rollout.advantages
        return masked_mean(rollout.advantages, rollout.policy_mask, dim=1)

    def log_completions(self) -> None:
        """Write the latest rollout's completions (every process's) to the completion log, once per rollout."""
        buffer = self.loop.buffer
        if buffer is None or buffer.completions_logged:
            return
        rows = completion_rows(
            buffer.rollout,
            self.processing_class,
            [reward_func_name(f) for f in self.reward_funcs],
            self.sample_advantages(buffer.rollout),
        )
        if self.accelerator.num_processes > 1:
            rows = gather_object(rows)
        if self.completion_log is not None:
            self.completion_log.write(self.state.global_step, rows, self.callback_handler.callbacks)
        buffer.completions_logged = True
