"""``cast_lm_head_to_fp32``: the output embedding's weight stored and its logits computed in float32 (ScaleRL's
recipe, Khatri et al., 2025), for a model trained or scored in bfloat16 / float16."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.head_logprobs import Float32Head, unwrapped


def cast_lm_head_to_fp32(model: nn.Module) -> None:
    """Store ``model``'s output embedding in float32 and make it compute its logits in float32 (``Float32Head``). A
    tied input embedding keeps returning its former dtype, so the layers above it run as before."""
    inner = unwrapped(model)
    head = inner.get_output_embeddings()
    if type(head) is Float32Head:
        return
    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        raise ValueError(
            f"cast_lm_head_to_fp32=True needs the LM head to be a plain torch.nn.Linear; this model's is a "
            f"{type(head).__name__} (a LoRA adapter on lm_head: remove it from the adapter's target_modules). Or set "
            "cast_lm_head_to_fp32=False."
        )
    dtype = head.weight.dtype
    head.float()
    head.__class__ = Float32Head
    embedding = inner.get_input_embeddings()
    if embedding is not None and embedding.weight is head.weight and dtype != torch.float32:
        embedding.register_forward_hook(lambda module, args, output: output.to(dtype))
