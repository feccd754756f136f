"""Partial rollouts (``partial_rollout_tokens``, with ``max_staleness``): a completion is generated in two segments.

    head  its first ``partial_rollout_tokens`` tokens, generated ahead with the weights of the global step its rollout
          was requested at (the worker, while the trainer trains on earlier rollouts);
    tail  the rest of a completion whose head ran to that length without ending, generated when its rollout is
          handed over to training, with the trainer's weights then (an in-flight weight update, at a token fixed by
          the config, not by the clock).

Every token keeps the log-prob it was sampled with, so the loss corrects each by its own sampling policy; no completion
is dropped, so nothing favours short ones. Shapes: N samples.
"""

from __future__ import annotations

import dataclasses
import hashlib

from ...generation import Generation
from ...rollout import SampledRollout


def tail_seed(seed: int) -> int:
    """The sampling seed of a completion's tail, from its own: stable across processes and restarts."""
    digest = hashlib.blake2b(f"{seed}/tail".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def unfinished(heads: SampledRollout, tokens: int) -> list[int]:
    """The samples whose head ran to ``tokens`` tokens without ending (EOS, a stop): each gets a tail."""
    return [
        i
        for i, (ids, stopped) in enumerate(zip(heads.completion_ids, heads.stopped))
        if not stopped and len(ids) == tokens
    ]


def with_tails(heads: SampledRollout, rows: list[int], tails: Generation | None, version: int) -> SampledRollout:
    """``heads`` with each of ``rows``' tail appended (sampled with the weights of global step ``version``): whole
    completions, each with its runs of weight versions, and the share of continued completions and fresh tokens."""
    ids = [list(row) for row in heads.completion_ids]
    logprobs = [list(row) for row in heads.logprobs]
    versions = [[[0, heads.version]] for _ in ids]
    fresh = 0
    for row, tail, tail_logprobs in zip(rows, tails.completion_ids if tails else [], tails.logprobs if tails else []):
        versions[row].append([len(ids[row]), version])
        ids[row] += tail
        logprobs[row] += tail_logprobs
        fresh += len(tail)
    metrics = {
        **heads.metrics,
        "async/partial/continued_share": len(rows) / len(ids),
        "async/partial/fresh_token_share": fresh / max(1, sum(len(row) for row in ids)),
    }
    return dataclasses.replace(
        heads, completion_ids=ids, logprobs=logprobs, versions=versions, stopped=None, seeds=None, metrics=metrics
    )
