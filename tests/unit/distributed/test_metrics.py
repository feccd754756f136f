"""Metrics of several processes are reduced by name, never by position: a reward function may log a metric on one
process only (TRL's ``log_metric``), and the logged values stay under their names. Two real processes over gloo,
through the two places that reduce metrics: a rollout's metrics (``whole_rollout_buffer``) and a logging step's
means (``pending_means``)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
from types import SimpleNamespace

import pytest

from steadyrl.distributed.metrics import combine_by_name
from steadyrl.trainers.loop.loop_state import PendingMetrics

# (process 0's metrics, process 1's) -> what both log
CASES = {
    "equal counts, other names": (
        {"reward": 1.0, "format_errors": 100.0},
        {"reward": 2.0, "length": 4.0},
        {"format_errors": 100.0, "length": 4.0, "reward": 1.5},
    ),
    "one process an extra metric": (
        {"reward": 1.0, "format_errors": 6.0},
        {"reward": 3.0},
        {"format_errors": 6.0, "reward": 2.0},
    ),
    "disjoint names": ({"a": 1.0}, {"b": 3.0, "c": 5.0}, {"a": 1.0, "b": 3.0, "c": 5.0}),
    "none on one process": ({}, {"kl": 0.5}, {"kl": 0.5}),
    "extremes": (
        {"ratio/min": 0.5, "ratio/mean": 1.0, "ratio/max": 2.0},
        {"ratio/min": 0.8, "ratio/mean": 2.0, "ratio/max": 1.5},
        {"ratio/max": 2.0, "ratio/mean": 1.5, "ratio/min": 0.5},
    ),
}


def rollout_of(rank: int):
    import torch

    from steadyrl.rollout import Rollout

    return Rollout(
        prompt_ids=torch.full((2, 3), 5 + rank),
        prompt_mask=torch.ones(2, 3, dtype=torch.long),
        completion_ids=torch.full((2, 2), 7),
        completion_mask=torch.ones(2, 2, dtype=torch.long),
        scores=torch.tensor([0.0, 1.0]) + rank,
    )


def reduce_on(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    from accelerate import Accelerator

    from steadyrl.trainers.loop.loop_state import whole_rollout_buffer
    from steadyrl.trainers.loop.reporting import ReportingMixin

    accelerator = Accelerator(cpu=True)
    args = SimpleNamespace(seed=0, train_batch_size=4, num_ppo_epochs=1, n_samples_per_prompt=2)
    for name, case in CASES.items():
        metrics = case[rank]
        buffer = whole_rollout_buffer(rollout_of(rank), metrics, args, 0, 2, accelerator)
        pending = PendingMetrics()
        pending.record(metrics)
        logged = ReportingMixin.pending_means(SimpleNamespace(pending_metrics=pending, accelerator=accelerator))
        results.put((rank, name, buffer.metrics, logged))


def test_metrics_of_two_processes_are_reduced_by_name():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=reduce_on, args=(rank, port, results)) for rank in range(2)]
    for process in processes:
        process.start()
    got = {}
    try:
        for _ in range(2 * len(CASES)):
            rank, name, rollout_metrics, logged = results.get(timeout=60)
            got[rank, name] = rollout_metrics, logged
    except queue.Empty:  # a collective that waits for ever: by position, names of unequal counts
        pass
    finally:
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
    for name, (_, _, expected) in CASES.items():
        for rank in (0, 1):
            assert got.get((rank, name)) == (expected, expected), (rank, name)
            assert list(got[rank, name][1]) == sorted(expected), "logged in name order"


@pytest.mark.parametrize("name", list(CASES))
def test_the_reduction_on_one_machine_is_the_collectives(name):
    zero, one, expected = CASES[name]
    assert combine_by_name([zero, one]) == expected


def test_pending_metrics_logged_on_some_processes_or_steps_reshard_by_name():
    """A resume on another number of processes: a metric only one saved process logged, or logged at fewer steps,
    keeps what the original run would log at its next logging step (the mean of each process's mean)."""
    saved = [
        {"loss": [1.0, 3.0], "format_errors": [4.0, 8.0], "ratio/min": [0.5, 0.7]},
        {"loss": [3.0, 5.0], "format_errors": [2.0], "ratio/min": [0.9, 0.1], "kl": [1.0]},
    ]
    one = PendingMetrics.reshard(saved, 0, 1)
    assert one == {
        "format_errors": [4.0, 4.0],  # (6 + 2) / 2, for each of the longest list's steps
        "kl": [1.0],
        "loss": [2.0, 4.0],  # step by step
        "ratio/min": [0.5, 0.5],  # the smaller of the processes' means, 0.6 and 0.5
    }
    pending = PendingMetrics()
    pending.load_state_dict(one)
    logged = combine_by_name([{key: sum(v) / len(v) for key, v in state.items()} for state in saved])
    assert pending.take_means() == logged
