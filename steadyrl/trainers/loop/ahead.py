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

A checkpoint first waits for the rollouts in flight (``drain``) and stores them (``SampledRollout``, JSON, this
process's checkpoint part ``rollouts_ahead``). The request schedule is the same after a resume, so a resumed run
trains on exactly what the uninterrupted one did.
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor

from ...generation import Generation
from ...generation.weights import whole_weights
from ...rollout import SampledRollout, scores_from_rows, scores_to_rows
from .scoring import Scorer
from .sources import RolloutSource, Sampled, TrainerStage


class AheadSource(RolloutSource, TrainerStage):
    """Single-turn rollouts generated (and, without reward models, scored) ``max_staleness`` rollouts ahead."""

    def __init__(self, trainer, scorer: Scorer, scores_on_worker: bool, *args) -> None:
        RolloutSource.__init__(self, *args)
        TrainerStage.__init__(self, trainer)
        self.scorer, self.scores_on_worker = scorer, scores_on_worker
        self.queue: list[SampledRollout] = []  # generated ahead, oldest first (a checkpoint part)
        self.in_flight: list[Future] = []
        self.pool: ThreadPoolExecutor | None = None
        self.snapshot_version, self.snapshot = None, None
        self.worker_tokenizer = copy.deepcopy(self.tokenizer)  # a tokenizer is not safe across threads
        self.worker_idle_since = time.perf_counter()

    def next(self) -> Sampled:
        """The oldest rollout generated ahead, after requesting every rollout up to this one + max_staleness."""
        if self.pool is None:
            self.pool, self.worker_idle_since = ThreadPoolExecutor(1, "steadyrl-ahead"), time.perf_counter()
        while len(self.queue) + len(self.in_flight) <= self.args.max_staleness:
            self.request()
        start = time.perf_counter()
        sampled = self.queue.pop(0) if self.queue else self.in_flight.pop(0).result()
        metrics = {
            **sampled.metrics,
            "async/trainer_wait_s": time.perf_counter() - start,
            "async/staleness_steps": self.trainer.state.global_step - sampled.version,
        }
        scores = None if sampled.scores is None else scores_from_rows(sampled.scores)  # None: scored by the trainer
        generation = Generation(sampled.completion_ids, sampled.logprobs)
        return Sampled(
            sampled.prompts, sampled.columns, sampled.prompt_ids, generation, sampled.generation_time, metrics, scores
        )

    def request(self) -> None:
        """Draw the next rollout's prompts and seeds, and have the worker generate and score it with a copy of the
        actor's current weights."""
        trainer = self.trainer
        prompts, columns, seeds = self.draw()
        prompt_ids, truncated = self.truncate_prompts(self.tokenize(prompts))
        version = trainer.state.global_step
        if self.snapshot_version != version:  # every rollout requested at one step shares one copy
            with whole_weights(trainer.model, everywhere=False, merged=True) as weights:
                self.snapshot = {name: t.detach().to("cpu", copy=True) for name, t in weights.items()}
            self.snapshot_version = version
        state = copy.copy(trainer.state)  # what the reward functions read: this step's, whenever they run
        args = (prompts, columns, seeds, prompt_ids, truncated, version, self.snapshot, state)
        self.in_flight.append(self.pool.submit(self.sample, *args))

    def sample(self, prompts, columns, seeds, prompt_ids, truncated, version, weights, state) -> SampledRollout:
        """On the worker thread: push ``weights`` if the server holds others, generate, and score with the reward
        functions (not reward models, which run on the trainer's thread)."""
        backend = self.trainer.backend
        metrics = {"async/generator_wait_s": time.perf_counter() - self.worker_idle_since}
        backend.push_copy(weights, version)
        start = time.perf_counter()
        generation = backend.generate(None, prompt_ids, seeds)
        generation_time = time.perf_counter() - start
        scores = None
        if self.scores_on_worker:
            sampled = Sampled(prompts, columns, prompt_ids, generation, generation_time)
            scores, logged = self.scorer(sampled, state, self.worker_tokenizer)
            scores = scores_to_rows(scores)
            metrics.update(logged)
        metrics["prompts_truncated"] = truncated / len(prompts)
        self.worker_idle_since = time.perf_counter()
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

    def drain(self) -> None:
        """Wait for the rollouts in flight and queue them (before a checkpoint stores them, or the server is used
        otherwise)."""
        for future in self.in_flight:
            self.queue.append(future.result())
        self.in_flight = []

    def close(self) -> None:
        if self.pool is not None:
            for future in self.in_flight:
                future.cancel()
            self.pool.shutdown(wait=True)
            self.pool, self.in_flight = None, []

    def state_dict(self) -> dict:
        return {"queue": [sampled.state_dict() for sampled in self.queue]}

    def load_state_dict(self, state: dict) -> None:
        self.queue = [SampledRollout.from_state_dict(sampled) for sampled in state["queue"]]
