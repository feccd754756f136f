"""What the training loop carries from one step to the next besides models and optimizers, as checkpoint parts: the
rollout being trained on (``TrainingBuffer``) and the metrics not yet logged (``PendingMetrics``), each process's
own. The other parts live with the stage that owns them (the prompt draw's counter, the rollouts generated ahead,
the algorithm's state, the meter)."""

from __future__ import annotations

from ...checkpoint.state_registry import Stateful
from ...rollout import RolloutBuffer

__all__ = ["NoAlgorithmState", "PendingMetrics", "Stateful", "TrainingBuffer"]


class NoAlgorithmState:
    """The state of an algorithm that keeps nothing between rollouts."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class TrainingBuffer:
    """The rollout being trained on and its mini-batch schedule (None between rollouts)."""

    def __init__(self) -> None:
        self.buffer: RolloutBuffer | None = None

    @property
    def needs_rollout(self) -> bool:
        return self.buffer is None or self.buffer.exhausted

    def state_dict(self) -> dict:
        return {} if self.needs_rollout else self.buffer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.buffer = RolloutBuffer.from_state_dict(state) if state else None


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
