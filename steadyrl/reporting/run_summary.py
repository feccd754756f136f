"""What a run reports besides its per-step metrics: every logged entry appended to ``output_dir/metrics.jsonl`` (so
a run without checkpoints keeps its history), and the end-of-training summary."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .jsonl import append_records, truncate_after

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """``output_dir/metrics.jsonl``: one JSON object per logged entry (the entry of ``state.log_history``, with its
    ``step``), and the run's summary; written by the main process only."""

    def __init__(self, output_dir: str) -> None:
        self.path = Path(output_dir) / METRICS_FILE

    def append(self, entry: dict) -> None:
        append_records(self.path, [entry])

    def truncate_after(self, step: int) -> None:
        """Drop what a run killed after its checkpoint at ``step`` logged (0: a fresh start drops everything)."""
        truncate_after(self.path, step)


@dataclass
class RunMeter:
    """Counts a run's work for its summary: this ``train()`` call's, plus what the checkpoint it resumed from had
    counted (``elapsed`` seconds of training and ``tokens`` generated before it), so that a resumed run reports the
    whole run."""

    start_step: int
    start_time: float = field(default_factory=time.time)
    tokens: int = 0  # completion tokens this process generated
    elapsed: float = 0.0  # seconds of training before this call, up to the checkpoint it resumed from

    def reset(self) -> None:
        self.tokens, self.elapsed = 0, 0.0

    def begin(self, step: int) -> None:
        """Start counting this ``train()`` call from global step ``step`` (what came before: ``load_state_dict``)."""
        self.start_step, self.start_time = step, time.time()

    def state_dict(self) -> dict:
        return {"elapsed": self.elapsed + time.time() - self.start_time, "tokens": self.tokens}

    def load_state_dict(self, state: dict) -> None:
        """Continue the counts of a checkpoint's meter."""
        self.elapsed, self.tokens = float(state["elapsed"]), int(state["tokens"])

    @staticmethod
    def reshard(states, rank: int, processes: int) -> dict:
        """On another number of processes: the first holds every saved process's tokens (a summary sums them)."""
        if len(states) == processes:
            return states[rank]
        states = states[:]
        tokens = sum(int(state["tokens"]) for state in states) if rank == 0 else 0
        return {"elapsed": max(float(state["elapsed"]) for state in states), "tokens": tokens}

    def summary(
        self, step: int, samples_per_step: int, tokens: int, log_history: list[dict], pending: dict[str, float]
    ) -> dict[str, float]:
        """Over the whole run, resumed or not: ``train_runtime``, steps / samples / generated tokens per second
        (``tokens``: every process's), ``train_loss`` (the mean over every step, as ``Trainer``'s) and the last
        ``reward``; ``pending``: the means of the steps since the last logging step."""
        runtime = max(self.elapsed + time.time() - self.start_time, 1e-9)
        loss = mean_step_loss(log_history, pending.get("loss"), step)
        rewards = [e["reward"] for e in log_history if "reward" in e] + (
            [pending["reward"]] if "reward" in pending else []
        )
        summary = {
            "train_runtime": runtime,
            "train_steps_per_second": step / runtime,
            "train_samples_per_second": step * samples_per_step / runtime,
            "train_tokens_per_second": tokens / runtime,
        }
        if loss is not None:
            summary["train_loss"] = loss
        if rewards:
            summary["final_reward"] = rewards[-1]
        return summary


def mean_step_loss(log_history: list[dict], pending_loss: float | None, step: int) -> float | None:
    """The mean loss over every step up to ``step``: each logged ``loss`` (a mean over the steps since the entry
    before it) weighted by the steps it covers, and ``pending_loss`` by the steps since the last one."""
    total, covered = 0.0, 0
    for entry in log_history:
        if "loss" in entry and entry.get("step", 0) > covered:
            total, covered = total + entry["loss"] * (entry["step"] - covered), entry["step"]
    if pending_loss is not None and step > covered:
        total, covered = total + pending_loss * (step - covered), step
    return total / covered if covered else None
