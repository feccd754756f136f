"""PEFT (LoRA) models seen through their wrapper: whether a model is one, and its base model's config."""

from __future__ import annotations

import torch


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def base_config(model: torch.nn.Module):
    """The Hugging Face config of ``model``, or of the base model under a PEFT wrapper."""
    return (model.get_base_model() if is_peft(model) else model).config
