"""Rollout sources: where a rollout's completions come from. One small interface, ``RolloutSource``:

    next(state)  the next rollout's prompts (this process's share, drawn by ``PromptDraw``), sampled -> ``Sampled``;
                 ``state``: the trainer's TrainerState now (its global_step is the weights' version)
    complete()   completions for given prompt rows (evaluation reuses it)
    drain()      wait for work in flight (before a checkpoint or an evaluation); close() at the end

Implementations: ``SingleTurnSource`` (synchronous), ``MultiTurnSource`` (tools, environments,
``rollout_func``: multi_turn.py) and ``AheadSource`` (``max_staleness``: generated and scored ahead, ahead.py).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import time
from dataclasses import dataclass, field

import torch

from ...data.images import encode_prompts, has_images, image_column, prompt_images, prompts_with_images
from ...data.prompts import PromptTruncation, tokenize_prompts
from ...data.sampling import next_rows
from ...distributed.fsdp import unsharded
from ...distributed.processes import on_every_process
from ...distributed.zero import zero3_generation
from ...generation import Generation, sampling_seed
from ...vision import ImageBatch


@dataclass
class Sampled:
    """One rollout's completions, before the scoring passes. Shapes: N samples (prompts x n_samples_per_prompt)."""

    prompts: list  # [N] as the reward functions see them (multi-turn: with an environment's reset() text)
    columns: dict[str, list]  # the dataset's other columns, [N] values each
    prompt_ids: list[list[int]]  # [N] the policy's prompt tokens, after max_prompt_length
    generation: Generation  # [N] completions (multi-turn: ``Trajectories``, with env_mask and conversations)
    generation_time: float
    metrics: dict[str, float] = field(default_factory=dict)
    scores: torch.Tensor | None = None  # [N, num_rewards] where the source scored them already (generated ahead)
    prompt_index: list[int] | None = None  # [N] each sample's prompt's row in the dataset (None: not from one)


def repeat_rows(rows: dict[str, list], k: int, keep_columns: bool) -> tuple[list, dict[str, list]]:
    """The prompts and the other columns of ``rows``, each row repeated ``k`` times (one per sample); without
    ``keep_columns`` (``remove_unused_columns``) no other column. An ``image`` or ``images`` column's images are
    placed in the (conversational) prompts, as TRL places them."""
    prompts = rows.pop("prompt")
    column = image_column(rows)
    if column is not None:
        prompts = prompts_with_images(prompts, rows[column], column)
    prompts = [p for p in prompts for _ in range(k)]
    if not keep_columns:
        return prompts, {}
    return prompts, {name: [v for v in values for _ in range(k)] for name, values in rows.items()}


class PromptDraw:
    """This process's share of each batch of ``rollout_batch_size`` prompts drawn, each ``n_samples_per_prompt``
    times, and one sampling seed per sample from (seed, draw, prompt, sample). A rollout is one draw, or with
    ``dynamic_sampling`` as many as it takes to fill it: counting draws, not rollouts, keeps every drawn prompt's
    seeds its own. Its state, the number of draws so far, is a checkpoint part."""

    def __init__(self, sampler, dataset, args, accelerator) -> None:
        self.sampler, self.dataset, self.args, self.accelerator = sampler, dataset, args, accelerator
        self.draws = 0  # batches of prompts drawn so far: part of every completion's sampling seed

    def __call__(self, whole: bool = False) -> tuple[list, dict[str, list], list[int], list[int]]:
        """This process's share of the next draw (``whole``: every process's, in process order): ``(prompts, columns,
        seeds, prompt_index)``, one entry per sample (``prompt_index``: the prompt's row in the dataset). A sample's
        seed does not depend on the number of processes."""
        k, seed = self.args.n_samples_per_prompt, self.args.seed
        prompts, columns, first_prompt, indices = self.next_prompts(whole)
        seeds = [sampling_seed(seed, self.draws, first_prompt + i // k, i % k) for i in range(len(prompts))]
        self.draws += 1
        return prompts, columns, seeds, [index for index in indices for _ in range(k)]

    def next_prompts(self, whole: bool = False) -> tuple[list, dict[str, list], int, list[int]]:
        """This process's share (``whole``: all) of the next rollout's prompts and columns, each repeated
        ``n_samples_per_prompt`` times, the index of its first prompt in the whole rollout, and its prompts' rows in
        the dataset."""
        args = self.args
        per_process = args.rollout_batch_size // (1 if whole else self.accelerator.num_processes)
        first = 0 if whole else self.accelerator.process_index * per_process
        part = slice(first, first + per_process)
        rows, indices = next_rows(self.sampler, self.dataset, args.rollout_batch_size, part)
        return *repeat_rows(rows, args.n_samples_per_prompt, not args.remove_unused_columns), first, indices

    def state_dict(self) -> dict:
        return {"count": self.draws}

    def load_state_dict(self, state: dict) -> None:
        self.draws = state["count"]


class ActorGenerator:
    """One completion per prompt row with the actor through the generation backend, each sampled with its seed; the
    actor's weights pushed first (as of ``version``), and gathered for HF generate under ZeRO-3 or FSDP2.

    Args:
        backend: the generation backend.
        actor: the policy (the Hugging Face model; under FSDP2 its sharded module).
        args: the config (``ds3_gather_for_generation``).
        reshard_after_forward: under FSDP2 the plugin's setting (None: not FSDP2).

    ``engine`` is the actor as prepared for training (a DeepSpeed engine under ZeRO-3), bound by the trainer once it
    is made; until then the actor itself.

    Example::

        generate = ActorGenerator(backend, model, args, reshard_after_forward=None)
        generation = generate(prompt_ids, seeds, version=0)
    """

    def __init__(self, backend, actor, args, reshard_after_forward: bool | None) -> None:
        self.backend, self.actor, self.engine, self.args = backend, actor, actor, args
        self.reshard_after_forward = reshard_after_forward

    def __call__(
        self,
        prompt_ids: list[list[int]],
        seeds: list[int],
        version: int,
        chunk: int | None = None,
        images: ImageBatch | None = None,
    ) -> Generation:
        """With HF generate in calls of ``chunk`` rows (all at once if None); vLLM schedules its own batches.
        ``images``: the rows' image inputs (a vision-language model's), returned with the generation."""
        backend, actor = self.backend, self.actor
        if images is not None and not backend.capabilities.takes_images:
            raise ValueError(
                f"the prompts have images, but the generation backend {type(backend).__name__} does not take them: "
                "use HF generate (use_vllm=False) for a vision-language model (docs/vision.md)."
            )
        backend.sync_weights(actor, version=version)
        if not backend.capabilities.runs_training_model or chunk is None:
            chunk = max(1, len(prompt_ids))
        if not backend.capabilities.runs_training_model:
            whole = contextlib.nullcontext()
        elif self.reshard_after_forward is not None:
            whole = unsharded(actor, self.reshard_after_forward)
        else:
            whole = zero3_generation(self.engine, self.args.ds3_gather_for_generation)
        with whole:
            parts = []
            for i in range(0, len(prompt_ids), chunk):
                rows = slice(i, i + chunk)
                extra = {} if images is None else {"images": images.select(rows)}
                parts.append(backend.generate(actor, prompt_ids[rows], seeds[rows], **extra))
        generation = Generation.concatenate(parts)
        generation.images = images
        return generation


class RolloutSource(abc.ABC):
    """Where a rollout's completions come from (the module docstring lists the implementations)."""

    @abc.abstractmethod
    def next(self, state) -> Sampled:
        """The next rollout's completions of this process's share of its prompts; ``state``: the trainer's now."""

    @abc.abstractmethod
    def complete(self, prompts: list, columns: dict, seeds: list[int], version: int, chunk: int | None = None):
        """``(prompts, prompt_ids, prompts truncated, generation)`` for given prompt rows (evaluation)."""

    def drain(self) -> None:  # noqa: B027 (nothing in flight where rollouts are generated when asked)
        """Wait for work in flight (before a checkpoint or an evaluation)."""

    def close(self) -> None:  # noqa: B027 (nothing held by default)
        """Release what the source holds, at the end of ``train()``."""


class SingleTurnSource(RolloutSource):
    """Single-turn rollouts, generated when asked: each prompt tokenized (chat template for conversations), cut to
    ``max_prompt_length``, and completed once."""

    def __init__(
        self, draw: PromptDraw, generate: ActorGenerator, tokenizer, conversational: bool, args, processor=None
    ) -> None:
        self.draw, self.generate, self.tokenizer, self.args = draw, generate, tokenizer, args
        self.conversational, self.processor = conversational, processor
        self.truncate_prompts = PromptTruncation(args.max_prompt_length)

    def next(self, state) -> Sampled:
        prompts, columns, seeds, prompt_index = self.draw()
        start = time.time()
        complete = functools.partial(self.complete, prompts, columns, seeds, state.global_step)
        if self.generate.backend.capabilities.pushes_copies:  # each process's own requests to a server:
            # a failure on one raises on every one, none waits for it in the scoring passes' collectives
            complete = functools.partial(on_every_process, self.draw.accelerator, "Generating a rollout", complete)
        prompts, prompt_ids, truncated, generation = complete()
        metrics = {**getattr(generation, "metrics", {}), "prompts_truncated": truncated / len(prompts)}
        elapsed = time.time() - start
        return Sampled(prompts, columns, prompt_ids, generation, elapsed, metrics, prompt_index=prompt_index)

    def complete(self, prompts: list, columns: dict, seeds: list[int], version: int, chunk: int | None = None):
        """``(prompts, prompt_ids, prompts truncated, generation)`` for prompt rows, sampled by the actor of global
        step ``version``; HF generate runs in calls of ``chunk`` rows (default ``micro_generation_batch_size``)."""
        chunk = chunk or self.args.micro_generation_batch_size
        if self.processor is not None and has_images(prompts):
            prompt_ids, images = self.encode_with_images(prompts)
            return prompts, prompt_ids, 0, self.generate(prompt_ids, seeds, version, chunk=chunk, images=images)
        prompt_ids, truncated = self.truncate_prompts(self.tokenize(prompts))
        return prompts, prompt_ids, truncated, self.generate(prompt_ids, seeds, version, chunk=chunk)

    def encode_with_images(
        self, prompts: list, tools_per_row: list | None = None, chat_template_kwargs: dict | None = None
    ) -> tuple[list[list[int]], ImageBatch]:
        """Token ids (the image tokens expanded) and image inputs of prompts with images, through the processor (with
        each row's tools described, if given). Such a prompt is never cut: its image tokens must match its image
        features."""
        kwargs = self.args.chat_template_kwargs if chat_template_kwargs is None else chat_template_kwargs
        prompt_ids, inputs = encode_prompts(prompts, self.processor, kwargs, tools_per_row)
        longest, limit = max(len(ids) for ids in prompt_ids), self.args.max_prompt_length
        if limit is not None and longest > limit and getattr(self.args, "_prompt_length_given", True):
            raise ValueError(
                f"a prompt with images is {longest} tokens long (its image tokens included), more than "
                f"max_prompt_length={limit}; a prompt with images is not cut, since its image tokens must match its "
                "image features. Raise max_prompt_length (or leave it unset: prompts with images are then kept "
                "whole), or give smaller images (the processor's max_pixels)."
            )
        return prompt_ids, ImageBatch.of_samples(inputs, longest, [prompt_images(prompt) for prompt in prompts])

    def tokenize(self, prompts: list) -> list[list[int]]:
        """The token ids the policy sees for each prompt, before truncation to ``max_prompt_length``."""
        return tokenize_prompts(prompts, self.tokenizer, self.conversational, self.args.chat_template_kwargs)
