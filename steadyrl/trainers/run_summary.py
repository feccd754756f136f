"""What a run reports besides its per-step metrics: every logged entry appended to ``output_dir/metrics.jsonl`` (so
a run without checkpoints keeps its history), and the end-of-training summary."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..jsonl import append_records, truncate_after

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
    """Counts a ``train()`` call's work for its summary."""

    start_step: int
    start_time: float = field(default_factory=time.time)
    tokens: int = 0  # completion tokens this process generated

    def summary(self, step: int, samples_per_step: int, tokens: int, log_history: list[dict]) -> dict[str, float]:
        """``train_runtime``, steps / samples / generated tokens per second (``tokens``: every process's), the mean
        ``train_loss`` and the last logged ``reward`` of this call."""
        runtime = max(time.time() - self.start_time, 1e-9)
        steps = step - self.start_step
        entries = [e for e in log_history if e.get("step", 0) > self.start_step]
        losses = [e["loss"] for e in entries if "loss" in e]
        rewards = [e["reward"] for e in entries if "reward" in e]
        summary = {"train_runtime": runtime, "train_steps_per_second": steps / runtime,
                   "train_samples_per_second": steps * samples_per_step / runtime,
                   "train_tokens_per_second": tokens / runtime}  # fmt: skip
        if losses:
            summary["train_loss"] = sum(losses) / len(losses)
        if rewards:
            summary["final_reward"] = rewards[-1]
        return summary
