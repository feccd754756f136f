"""Where the frozen models (reference, reward models) live: on the device, in CPU memory between uses, or
partitioned over the processes under DeepSpeed ZeRO-3."""

from __future__ import annotations

import contextlib

import torch

from .zero import inference_engine


def place_frozen_models(ref_model, scorers: list, device, zero3_config: dict | None, offload: bool):
    """Put the reference and reward models where they are used; return the reference.

    Under ZeRO-3 (``zero3_config``) they become DeepSpeed inference engines partitioned like the trained models
    (each process holds 1/N of their weights; with ``offload`` in CPU memory); otherwise they sit whole on the
    device, or with ``offload`` in CPU memory between uses.
    """
    if zero3_config is not None:
        if ref_model is not None:
            ref_model = inference_engine(ref_model, zero3_config, offload)
        for scorer in scorers:  # the engine offloads its partitions itself
            scorer.model = inference_engine(scorer.model, zero3_config, scorer.offload)
            scorer.offload, scorer.device = False, device
        return ref_model
    if ref_model is not None and not offload:
        ref_model.to(device)
    for scorer in scorers:
        scorer.to(device)
    return ref_model


@contextlib.contextmanager
def offloaded(model: torch.nn.Module, device, offload: bool):
    """With ``offload``, move ``model`` to ``device`` for the block and back to CPU memory after it."""
    if offload:
        model.to(device)
    try:
        yield model
    finally:
        if offload:
            model.to("cpu")
