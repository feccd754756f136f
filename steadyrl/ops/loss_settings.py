"""The config values the policy losses read (policy_loss.py, aggregations.py), under GRPOConfig's and RLOOConfig's
names."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class LossSettings:
    """The config values a policy loss reads (GRPOConfig's and RLOOConfig's names; ``of(config)`` takes them)."""

    cliprange: float = 0.2  # TRL: epsilon
    cliprange_high: float | None = None  # TRL: epsilon_high; None: cliprange
    delta: float | None = None
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    beta: float = 0.0  # the KL term's coefficient, where the trainer passes one
    use_bias_correction_kl: bool = False
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    @classmethod
    def of(cls, config) -> LossSettings:
        return cls(**{f.name: getattr(config, f.name, f.default) for f in fields(cls)})

    @property
    def high(self) -> float:
        return self.cliprange if self.cliprange_high is None else self.cliprange_high
