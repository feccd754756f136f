"""The names a model's weights have in its saved files. transformers saves some models under their original
checkpoint's names (a vision-language model's ``model.layers.*`` for its live ``model.language_model.layers.*``) and
renames them as it loads; a checkpoint's weights are read back into the live model by the same renaming."""

from __future__ import annotations

import torch


def saved_names(model: torch.nn.Module) -> dict[str, str]:
    """``{live name: saved name}`` of every tensor in ``model``'s state dict that ``save_pretrained`` renames (none
    for most models). A tensor the conversion does not keep as it is (a fused or split weight) keeps its name."""
    from transformers import PreTrainedModel
    from transformers.modeling_utils import revert_weight_conversion

    if not isinstance(model, PreTrainedModel):
        return {}
    live = model.state_dict(keep_vars=True)
    reverted = revert_weight_conversion(model, dict(live))
    by_identity = {id(tensor): name for name, tensor in live.items()}
    renamed = {by_identity.get(id(tensor)): saved for saved, tensor in reverted.items()}
    return {name: saved for name, saved in renamed.items() if name is not None and name != saved}


def to_live_names(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A saved state dict under ``model``'s live names."""
    live = {saved: name for name, saved in saved_names(model).items()}
    return {live.get(name, name): tensor for name, tensor in state.items()}
