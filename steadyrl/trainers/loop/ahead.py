"""Rollouts generated ahead of training (``max_staleness``): while the trainer trains on rollout r, a worker thread
has the vLLM server generate, and the reward functions score, the rollouts up to r + max_staleness.

Exactness does not depend on timing. Everything a rollout holds is fixed when it is requested:
- its prompts and seeds (drawn on the trainer thread, in order);
- the weights it is sampled with (a copy of the actor's at that global step, pushed by the worker before it
  generates);
- the trainer state its reward functions read.

Requests are made at fixed points: before rollout r is trained on, every rollout up to r + max_staleness is
requested. Rollout r is therefore sampled with the weights from max_staleness rollouts back (fewer at the start), and
the loss corrects for the lag with vLLM's importance weights.

A checkpoint first waits for the rollouts in flight and stores them (``SampledRollout``, JSON). The request
schedule is the same after a resume, so a resumed run trains on exactly what the uninterrupted one did.
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from ...generation import Generation
from ...generation.weights import whole_weights
from ...models.scalar_head import RewardModelFunction
from ...rollout import RolloutBuffer, SampledRollout, scores_from_rows, scores_to_rows


class AheadMixin:
    """``max_staleness`` for ``OnPolicyTrainer``: ``next_buffer`` instead of ``make_rollout``."""

    def next_buffer(self) -> RolloutBuffer:
        """The buffer of the next rollout: made now, or with ``max_staleness`` taken from those generated ahead
        (after requesting every rollout up to this one + max_staleness)."""
        if not self.args.max_staleness:
            return self.make_rollout()
        if getattr(self, "_ahead_pool", None) is None:
            self._ahead_pool, self._in_flight = ThreadPoolExecutor(1, "steadyrl-ahead"), []
            self._snapshot_version, self._snapshot = None, None
            self._ahead_tokenizer = copy.deepcopy(self.processing_class)  # a tokenizer is not safe across threads
            self._worker_idle_since = time.perf_counter()
        while len(self.loop.queue) + len(self._in_flight) <= self.args.max_staleness:
            self.request_ahead()
        start = time.perf_counter()
        sampled = self.loop.queue.pop(0) if self.loop.queue else self._in_flight.pop(0).result()
        metrics = {
            **sampled.metrics,
            "async/trainer_wait_s": time.perf_counter() - start,
            "async/staleness_steps": self.state.global_step - sampled.version,
        }
        generation = Generation(sampled.completion_ids, sampled.logprobs)
        if sampled.scores is None:  # reward models score on the trainer's thread
            scores, logged = self.score_generation(sampled.prompts, sampled.prompt_ids, generation, sampled.columns)
            metrics.update(logged)
        else:
            scores = scores_from_rows(sampled.scores)
        with torch.no_grad():
            return self.finish_rollout(sampled.prompt_ids, generation, scores, sampled.generation_time, metrics)

    def request_ahead(self) -> None:
        """Draw the next rollout's prompts and seeds, and have the worker generate and score it with a copy of the
        actor's current weights."""
        prompts, columns, seeds = self.draw_rollout()
        prompt_ids, truncated = self.truncate_prompts(self.tokenize(prompts))
        version = self.state.global_step
        if self._snapshot_version != version:  # every rollout requested at one step shares one copy
            with whole_weights(self.model, everywhere=False, merged=True) as weights:
                self._snapshot = {name: t.detach().to("cpu", copy=True) for name, t in weights.items()}
            self._snapshot_version = version
        state = copy.copy(self.state)  # what the reward functions read: this step's, whenever they run
        future = self._ahead_pool.submit(
            self.sample_ahead, prompts, columns, seeds, prompt_ids, truncated, version, self._snapshot, state
        )
        self._in_flight.append(future)

    def sample_ahead(self, prompts, columns, seeds, prompt_ids, truncated, version, weights, state) -> SampledRollout:
        """On the worker thread: push ``weights`` if the server holds others, generate, and score with the reward
        functions (not reward models, which run on the trainer's thread)."""
        metrics = {"async/generator_wait_s": time.perf_counter() - self._worker_idle_since}
        self.backend.push_copy(weights, version)
        start = time.perf_counter()
        generation = self.backend.generate(None, prompt_ids, seeds)
        generation_time = time.perf_counter() - start
        scores = None
        if not any(isinstance(func, RewardModelFunction) for func in self.reward_funcs):
            scores, logged = self.score_generation(
                prompts, prompt_ids, generation, columns, state, self._ahead_tokenizer
            )
            scores = scores_to_rows(scores)
            metrics.update(logged)
        metrics["prompts_truncated"] = truncated / len(prompts)
        self._worker_idle_since = time.perf_counter()
        return SampledRollout(
            version,
            prompts,
            columns,
            prompt_ids,
            generation.completion_ids,
            generation.logprobs,
            scores,
            metrics,
            generation_time,
        )

    def drain_ahead(self) -> None:
        """Wait for the rollouts in flight and queue them (before a checkpoint stores them, or the server is used
        or released otherwise)."""
        for future in getattr(self, "_in_flight", []):
            self.loop.queue.append(future.result())
        self._in_flight = []

    def close_ahead(self) -> None:
        pool = getattr(self, "_ahead_pool", None)
        if pool is not None:
            for future in self._in_flight:
                future.cancel()
            pool.shutdown(wait=True)
            self._ahead_pool, self._in_flight = None, []
