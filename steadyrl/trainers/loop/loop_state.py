"""What the training loop carries from one step to the next besides models and optimizers, as checkpoint parts: the
rollout being trained on (``TrainingBuffer``) and the metrics not yet logged (``PendingMetrics``), each process's
own. The other parts live with the stage that owns them (the prompt draw's counter, the rollouts generated ahead,
the algorithm's state, the meter)."""

from __future__ import annotations

import torch

from ...checkpoint.state_registry import Stateful
from ...distributed.metrics import combine, reduce_by_name, reduction_of
from ...distributed.rollout_exchange import gather_rollout
from ...generation.base import sampling_seed
from ...rollout import Rollout, RolloutBuffer, minibatch_schedule

__all__ = ["NoAlgorithmState", "PendingMetrics", "Stateful", "TrainingBuffer", "whole_rollout_buffer"]


class NoAlgorithmState:
    """The state of an algorithm that keeps nothing between rollouts."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class TrainingBuffer:
    """The rollout being trained on and its mini-batch schedule (None between rollouts), of which this process
    trains part ``part`` of ``parts`` of each mini-batch."""

    def __init__(self, part: int = 0, parts: int = 1) -> None:
        self.buffer: RolloutBuffer | None = None
        self.part, self.parts = part, parts

    @property
    def needs_rollout(self) -> bool:
        return self.buffer is None or self.buffer.exhausted

    def next_minibatch(self) -> Rollout:
        return self.buffer.next_minibatch(self.part, self.parts)

    def counted_tokens(self) -> int:
        """The rollout's completion tokens, on the first process (every process holds the whole rollout)."""
        return int(self.buffer.rollout.completion_mask.sum()) if self.part == 0 else 0

    def state_dict(self) -> dict:
        return {} if self.needs_rollout else self.buffer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.buffer = RolloutBuffer.from_state_dict(state) if state else None

    @staticmethod
    def reshard(states, rank: int, processes: int) -> dict:
        """Every process holds the whole rollout: the first saved process's state is every process's. A buffer of
        steadyrl's state format 4 held each process's share: the shares are put together (``whole_buffer_state``)."""
        if not states[0] or states[0].get("whole"):
            return states[0]
        from ...distributed.rollout_exchange import whole_buffer_state

        return whole_buffer_state(states[:])


class PendingMetrics:
    """One value per step of each metric since the last logging step."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def record(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.values.setdefault(key, []).append(float(value))

    def take_means(self) -> dict[str, float]:
        """The mean of each pending metric since the last call, by name; the pending metrics are cleared."""
        means = {key: sum(values) / len(values) for key, values in sorted(self.values.items()) if values}
        self.values = {}
        return means

    def state_dict(self) -> dict:
        return {key: list(values) for key, values in self.values.items()}

    def load_state_dict(self, state: dict) -> None:
        self.values = {key: list(values) for key, values in state.items()}

    @staticmethod
    def reshard(states, rank: int, processes: int) -> dict:
        """On another number of processes, the saved processes' values put together by name, the same on every
        process, so that a logging step gives what the original run would have logged: a metric every process logged
        at every step is averaged step by step; one that some processes logged, or logged at fewer steps, is their
        means combined as a logging step combines them (``reduction_of``), once for each step of the longest list."""
        if len(states) == processes:
            return states[rank]
        states = states[:]
        keys = sorted({key for state in states for key in state})
        return {key: merged_steps(key, [s[key] for s in states if s.get(key)]) for key in keys}


def merged_steps(key: str, lists: list[list[float]]) -> list[float]:
    """The pending values of metric ``key`` of the saved processes that have any, as one process's."""
    if not lists:
        return []
    if reduction_of(key) == "mean" and len({len(values) for values in lists}) == 1:
        return [sum(step) / len(step) for step in zip(*lists)]
    combined = combine(key, [sum(values) / len(values) for values in lists])
    return [combined] * max(len(values) for values in lists)


def whole_rollout_buffer(
    rollout: Rollout, metrics: dict, args, step: int, samples_per_group: int, accelerator
) -> RolloutBuffer:
    """This process's share of a rollout made at global step ``step`` -> the whole rollout, on the CPU, with its
    global mini-batches of ``train_batch_size`` samples. The schedule is drawn from the run's seed and the step, not
    from the global RNG, so it is the same on every process and for any number of processes."""
    rollout = gather_rollout(rollout, accelerator)
    if accelerator.num_processes > 1:  # each share's metrics -> combined by name, as a logging step takes them
        metrics = reduce_by_name(metrics, accelerator)
    generator = torch.Generator().manual_seed(sampling_seed(args.seed, step, -1, -1))
    sizes = args.train_batch_size, args.num_ppo_epochs, samples_per_group, args.n_samples_per_prompt
    schedule = minibatch_schedule(len(rollout), *sizes, generator)
    return RolloutBuffer(rollout.to("cpu"), schedule, metrics)
