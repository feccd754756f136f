"""LoopState: what the training loop carries from one step to the next besides models and optimizers."""

from __future__ import annotations

from typing import Protocol

from ...data.sampling import PromptSampler
from ...data.stream import StreamSampler
from ...rollout import RolloutBuffer, SampledRollout


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class NoAlgorithmState:
    """The state of an algorithm that keeps nothing between rollouts."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class LoopState:
    """The prompt sampler's position, the rollout counter, the rollout being trained on, metrics not yet logged
    and the algorithm's own state (PPO: its KL coefficient and score moments). A checkpoint saves
    ``state_dict()`` and a resume hands it back to ``load_state_dict``, so the run continues exactly."""

    def __init__(self, sampler: PromptSampler | StreamSampler, algorithm: Stateful) -> None:
        self.sampler = sampler
        self.algorithm = algorithm
        self.rollouts = 0  # rollouts made so far: part of every completion's sampling seed
        self.buffer: RolloutBuffer | None = None
        self.pending_metrics: dict[str, list[float]] = {}  # one value per step since the last log
        self.queue: list[SampledRollout] = []  # max_staleness: rollouts generated ahead, oldest first

    @property
    def needs_rollout(self) -> bool:
        return self.buffer is None or self.buffer.exhausted

    def record(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.pending_metrics.setdefault(key, []).append(float(value))

    def take_means(self) -> dict[str, float]:
        """The mean of each pending metric since the last call, by name; the pending metrics are cleared."""
        means = {key: sum(values) / len(values) for key, values in sorted(self.pending_metrics.items()) if values}
        self.pending_metrics = {}
        return means

    def state_dict(self) -> dict:
        """``sampler``, ``rollouts`` and ``algorithm`` are the same on every process; ``pending_metrics`` and
        ``buffer`` (None between rollouts) are each process's own."""
        return {
            "sampler": self.sampler.state_dict(),
            "rollouts": self.rollouts,
            "algorithm": self.algorithm.state_dict(),
            "pending_metrics": {key: list(values) for key, values in self.pending_metrics.items()},
            "buffer": None if self.needs_rollout else self.buffer.state_dict(),
            "queue": [sampled.state_dict() for sampled in self.queue],
        }

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.rollouts = state["rollouts"]
        self.algorithm.load_state_dict(state["algorithm"])
        self.pending_metrics = {key: list(values) for key, values in state["pending_metrics"].items()}
        self.buffer = None if state["buffer"] is None else RolloutBuffer.from_state_dict(state["buffer"])
        self.queue = [SampledRollout.from_state_dict(sampled) for sampled in state.get("queue") or []]
