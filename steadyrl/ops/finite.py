"""Which tensors (or numbers) hold a NaN or an infinity: what keeps a non-finite number out of the weights a
checkpoint or an inference engine receives."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


class NonFiniteError(ValueError):
    """Weights or optimizer state about to be saved or pushed hold a NaN or an infinity."""


def nonfinite_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors of ``named`` that hold a NaN or an infinity, each with how many
    (``"model.embed_tokens.weight (3 of 4096)"``).

    A tensor whose sum is finite holds no NaN and no infinity (either would make the sum one), and a sum reads the
    tensor once without writing anything, several times faster than ``isfinite``: only a tensor whose sum is not
    finite (or overflowed) is looked at element by element."""
    named = [(name, tensor) for name, tensor in named if tensor.is_floating_point() and tensor.numel()]
    if not named:
        return []
    sums = torch.stack([tensor.sum(dtype=torch.float32).cpu() for _, tensor in named])
    found = []
    for (name, tensor), finite in zip(named, torch.isfinite(sums).tolist()):
        if not finite and (bad := int((~torch.isfinite(tensor)).sum())):
            found.append(f"{name} ({bad} of {tensor.numel()})")
    return found


def nonfinite_numbers(value, name: str = "") -> list[str]:
    """The dotted names of the non-finite floats and floating-point tensors anywhere in a nested state (dicts, lists,
    tensors, numbers), such as an optimizer's or an algorithm's ``state_dict()``."""
    leaves = list(_leaves(value, name))
    numbers = [key for key, leaf in leaves if isinstance(leaf, float) and not math.isfinite(leaf)]
    return numbers + nonfinite_tensors((key, leaf) for key, leaf in leaves if torch.is_tensor(leaf))


def _leaves(value, name: str):
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        yield name, value
        return
    for key, item in items:
        yield from _leaves(item, f"{name}.{key}" if name else str(key))


def first_names(found: list[str], limit: int = 5) -> str:
    """``found`` for a message: its first ``limit`` names, and how many more."""
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return ", ".join(found[:limit]) + more


def refuse_nonfinite(named: Iterable[tuple[str, torch.Tensor]], what: str) -> None:
    """Raise ``NonFiniteError`` naming the tensors of ``named`` that are not finite (``first_names``); ``what`` says
    whose they are and where they were going."""
    refuse_found(nonfinite_tensors(named), what)


def refuse_found(found: list[str], what: str) -> None:
    """Raise ``NonFiniteError`` if ``found`` (names of non-finite numbers) is not empty."""
    if found:
        raise NonFiniteError(f"{what}: {first_names(found)} hold NaN or infinite values.")
