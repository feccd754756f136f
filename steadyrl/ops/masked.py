"""Statistics over the entries a mask selects (completion tokens, not padding)."""

from __future__ import annotations

from collections.abc import Callable

import torch

SumOverProcesses = Callable[[torch.Tensor], torch.Tensor]  # an all-reduce sum, the same result on every process


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of the entries where ``mask`` is 1."""
    mean = masked_mean(values, mask)
    count = mask.sum().clamp(min=2)
    return ((values - mean) ** 2 * mask).sum() / (count - 1)


def masked_moments(
    values: torch.Tensor, mask: torch.Tensor, sum_over_processes: SumOverProcesses | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased variance of the entries where ``mask`` is 1. With ``sum_over_processes``, of those of every
    process, from sums taken in float64 (two passes: the mean, then the squared deviations): the same numbers
    whatever the number of processes, up to rounding."""
    if sum_over_processes is None:
        return masked_mean(values, mask), masked_var(values, mask)
    values64, mask64 = values.double(), mask.double()
    count, total = sum_over_processes(torch.stack([mask64.sum(), (values64 * mask64).sum()])).unbind()
    mean = total / count.clamp(min=1)
    squares = sum_over_processes(((values64 - mean) ** 2 * mask64).sum().reshape(1))[0]
    var = squares / (count.clamp(min=2) - 1)
    return mean.to(values.dtype), var.to(values.dtype)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, moments: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """(values - mean) / std over the masked entries; masked-out entries are zeroed. ``moments``: the (mean,
    unbiased variance) to use instead of ``masked_moments(values, mask)`` (e.g. those of every process's values)."""
    mean, var = masked_moments(values, mask) if moments is None else moments
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened * mask
