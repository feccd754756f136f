"""Statistics over the entries a mask selects (completion tokens, not padding)."""

from __future__ import annotations

import torch


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


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(values - mean) / std over the masked entries; masked-out entries are zeroed."""
    whitened = (values - masked_mean(values, mask)) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    return whitened * mask
