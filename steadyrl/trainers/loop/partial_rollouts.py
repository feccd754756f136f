"""Partial rollouts (``partial_rollout_tokens`` = K, with ``max_staleness`` = s): a completion is generated in
segments, each with the newest weights at a point fixed by the config, not by the clock.

    head     its first K tokens, generated ahead with the weights of the global step its rollout was requested at
             (the worker, while the trainer trains on earlier rollouts);
    middle   at each later hand-over before its own (s - 1 of them), K more tokens of a completion still unfinished,
             with the trainer's weights then: an in-flight weight update;
    tail     the rest, when its rollout is handed over to training, with the trainer's weights then.

So a completion spans up to s + 1 weight versions. Every token keeps the log-prob it was sampled with, so the loss
corrects each by its own sampling policy; no completion is dropped, so nothing favours short ones. Shapes: N samples.
"""

from __future__ import annotations

import dataclasses
import hashlib

from ...generation import Generation
from ...rollout import SampledRollout


def tail_seed(seed: int, segment: int | None = None) -> int:
    """The sampling seed of a completion's tail (``segment`` None) or of its middle segment ``segment`` (1, 2, ...),
    from its own: stable across processes and restarts."""
    label = "tail" if segment is None else f"segment-{segment}"
    digest = hashlib.blake2b(f"{seed}/{label}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def head_versions(count: int, version: int) -> list[list[list[int]]]:
    """``count`` heads' runs of weight versions: every token from the first at ``version``."""
    return [[[0, version]] for _ in range(count)]


def runs_of(rollout: SampledRollout) -> list[list[list[int]]]:
    """Each completion's runs of weight versions (a head stored without them: all at the rollout's version)."""
    return rollout.versions or head_versions(len(rollout.completion_ids), rollout.version)


def unfinished(rollout: SampledRollout, tokens: int, limit: int) -> list[int]:
    """The samples whose every segment ran to ``tokens`` tokens without ending (EOS, a stop), short of ``limit``
    (``max_completion_length``): each is continued."""
    return [
        i
        for i, (ids, stopped, runs) in enumerate(zip(rollout.completion_ids, rollout.stopped, runs_of(rollout)))
        if not stopped and len(ids) == tokens * len(runs) < limit
    ]


def with_segment(rollout: SampledRollout, rows: list[int], segment: Generation, version: int) -> SampledRollout:
    """``rollout`` with ``segment``'s completion of each of ``rows`` appended, sampled with the weights of global step
    ``version``; which of them ended is ``segment``'s to say."""
    ids = [list(row) for row in rollout.completion_ids]
    logprobs = [list(row) for row in rollout.logprobs]
    versions = [[list(run) for run in runs] for runs in runs_of(rollout)]
    stopped = list(rollout.stopped)
    for row, more, more_logprobs, ended in zip(rows, segment.completion_ids, segment.logprobs, segment.stopped):
        versions[row].append([len(ids[row]), version])
        ids[row] += more
        logprobs[row] += more_logprobs
        stopped[row] = ended
    return dataclasses.replace(rollout, completion_ids=ids, logprobs=logprobs, versions=versions, stopped=stopped)


def with_tails(rollout: SampledRollout, rows: list[int], tails: Generation | None, version: int) -> SampledRollout:
    """``rollout`` with each of ``rows``' tail appended (sampled with the weights of global step ``version``): whole
    completions, each with its runs of weight versions, and the share of continued completions and fresh tokens."""
    if tails is not None:
        rollout = with_segment(rollout, rows, tails, version)
    fresh = 0 if tails is None else sum(len(tail) for tail in tails.completion_ids)
    metrics = {
        **rollout.metrics,
        "async/partial/continued_share": len(rows) / len(rollout.completion_ids),
        "async/partial/fresh_token_share": fresh / max(1, sum(len(row) for row in rollout.completion_ids)),
        "async/partial/versions_max": max(len(runs) for runs in runs_of(rollout)),
    }
    return dataclasses.replace(rollout, stopped=None, seeds=None, metrics=metrics)
