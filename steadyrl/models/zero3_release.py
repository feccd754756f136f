"""ZeRO-3's buffer sizes for the model at hand, where the DeepSpeed config leaves them unset: DeepSpeed's defaults
suit models far above a billion parameters, and below that they keep a whole model's worth of memory per process.

- ``stage3_max_reuse_distance`` / ``stage3_max_live_parameters`` (default 1e9 each): a layer's gathered weights are
  released after use only if no module within the reuse distance (in parameters) uses them again. Below a billion
  parameters every layer is reused within it (by the backward pass, and the next forward pass), so the training
  passes hold the whole model gathered on every process. steadyrl releases every layer after use (reuse distance 0:
  the backward pass gathers it again, as it must for any model too big to hold whole) and lets at most a tenth of
  the trained model's parameters be gathered at once (prefetching included).
- ``reduce_bucket_size`` (default 5e8 elements, 2 GB in float32): gradients wait in a bucket that size before they
  are reduce-scattered, so below 5e8 parameters the whole model's gradients are held at once. steadyrl fills it, and
  ``stage3_prefetch_bucket_size`` and ``stage3_param_persistence_threshold``, from the hidden size as transformers
  fills their ``"auto"`` (hidden², 0.9 x hidden², 10 x hidden); accelerate's config files (``zero3.yaml``) leave
  them unset, so DeepSpeed's defaults applied.

Measured on SmolLM2-135M, RLOO, 2 processes: the first step's peak RSS per process fell from 4.5 GB to 3.4 GB.
"""

from __future__ import annotations

import torch
from transformers.utils import logging

from .peft import base_config

logger = logging.get_logger(__name__)

SHARE_LIVE = 10  # at most 1/10 of the model's parameters gathered at once


def model_numel(model: torch.nn.Module) -> int:
    """Parameters of ``model``, whole even where ZeRO-3 already partitioned them (``ds_numel``)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in {id(p): p for p in model.parameters()}.values())


def zero3_buffer_sizes(model: torch.nn.Module) -> dict[str, int]:
    """The ZeRO-3 buffer settings steadyrl gives ``model`` (see above)."""
    sizes = {"stage3_max_live_parameters": max(1, model_numel(model) // SHARE_LIVE), "stage3_max_reuse_distance": 0}
    hidden = getattr(base_config(model), "hidden_size", None) if hasattr(model, "config") else None
    if isinstance(hidden, int):
        sizes.update(
            reduce_bucket_size=hidden * hidden,
            stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
            stage3_param_persistence_threshold=10 * hidden,
        )
    return sizes


def bound_zero3_buffers(deepspeed_config: dict, model: torch.nn.Module) -> dict[str, int]:
    """Set the ZeRO-3 buffer settings the config leaves unset (or ``"auto"``) for ``model``; return those set."""
    zero = deepspeed_config.setdefault("zero_optimization", {})
    if int(zero.get("stage", 0)) != 3:
        return {}
    chosen = {name: value for name, value in zero3_buffer_sizes(model).items() if zero.get(name, "auto") == "auto"}
    zero.update(chosen)
    if chosen:
        logger.info(
            "ZeRO-3 buffers for this model: %s (set them in the DeepSpeed config to override).",
            ", ".join(f"{name}={value}" for name, value in chosen.items()),
        )
    return chosen
