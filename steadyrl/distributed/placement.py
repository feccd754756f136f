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


def frozen_output_embedding(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """A frozen model's LM head whole, outside its forward: (weight [V, H], bias or None, whether it is split over the
    processes). A ZeRO-3 partitioned head is gathered and copied, an FSDP2 sharded one put together
    (``full_tensor``): each process then holds the whole V x H head, which its caller keeps (the weights never
    change). Else the parameters themselves, wherever the model is now."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):  # a DeepSpeed engine's model
        model = model.module
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    params = [p for p in (weight, bias) if p is not None]
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return weight.detach().clone(), None if bias is None else bias.detach().clone(), True
    if any(hasattr(p, "full_tensor") for p in params):
        whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in (weight, bias) if p is not None]
        return whole[0].detach(), whole[1].detach() if bias is not None else None, True
    return weight.detach(), None if bias is None else bias.detach(), False
