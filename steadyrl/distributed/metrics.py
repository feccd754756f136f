"""Metrics of several processes reduced by name, never by position: a process may log a metric the others do not
(a reward function's ``log_metric`` called only when there is something to count, importance-ratio extremes of a
share without loss tokens), and each name is reduced over the processes that have it."""

from __future__ import annotations

from collections.abc import Sequence

from accelerate.utils import gather_object

__all__ = ["combine", "combine_by_name", "reduce_by_name", "reduction_of"]


def reduction_of(name: str) -> str:
    """How a metric's values of several processes (or steps) combine: the extremes of ``.../min`` and ``.../max``
    (TRL's ``sampling/importance_sampling_ratio/min``: the smallest over the processes), the mean of the rest."""
    if name.endswith("/min"):
        return "min"
    if name.endswith("/max"):
        return "max"
    return "mean"


def combine(name: str, values: Sequence[float]) -> float:
    """``values`` of metric ``name`` (one per process that has it) as one, by ``reduction_of(name)``."""
    rule = reduction_of(name)
    if rule == "min":
        return min(values)
    if rule == "max":
        return max(values)
    return sum(values) / len(values)


def combine_by_name(metrics: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each name of any of ``metrics`` (one dict per process, in rank order) -> its values combined over the dicts
    that have it; sorted by name."""
    names = sorted({name for values in metrics for name in values})
    return {name: combine(name, [values[name] for values in metrics if name in values]) for name in names}


def reduce_by_name(metrics: dict[str, float], accelerator) -> dict[str, float]:
    """This process's ``metrics`` -> every process's, combined by name (``combine_by_name``), the same dict on every
    process. A collective: every process calls it, with whatever names it has (none included)."""
    if accelerator.num_processes == 1:
        return combine_by_name([metrics])
    everyone = gather_object([{name: float(value) for name, value in metrics.items()}])  # rank order
    return combine_by_name(everyone)
