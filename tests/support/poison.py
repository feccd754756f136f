"""Non-finite numbers put into a run on purpose: a NaN (or inf) gradient element during chosen steps, as an overflow,
a log of zero or a 0/0 would make one, and the tensors of a checkpoint checked for any."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import TrainerCallback


class PoisonGradient(TrainerCallback):
    """During the steps that make the global steps ``steps``, one element of one trained parameter's gradient becomes
    ``value`` on process ``rank`` (its all-reduce or reduce-scatter then spreads it to every process): a hook on the
    parameter, which runs before DDP's or DeepSpeed's own. ``module``: "actor" (the policy) or "critic" (PPO)."""

    def __init__(self, steps, rank: int = 0, value: float = math.nan, module: str = "actor") -> None:
        self.steps, self.rank, self.value, self.module = set(steps), rank, value, module
        self.trainer, self.handle, self.poisoned = None, None, []

    def parameter(self) -> torch.nn.Parameter:
        model = self.trainer.model if self.module == "actor" else self.trainer.critic.model
        return next(p for name, p in model.named_parameters() if p.requires_grad and "bias" not in name)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 in self.steps and self.trainer.accelerator.process_index == self.rank:

            def poison(grad):
                grad = grad.clone()
                grad.view(-1)[0] = self.value
                return grad

            self.handle = self.parameter().register_hook(poison)
            self.poisoned.append(state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def poison_gradient(trainer, steps, **kwargs) -> PoisonGradient:
    """Add a ``PoisonGradient`` to ``trainer`` (its hook needs the trainer's model)."""
    callback = PoisonGradient(steps, **kwargs)
    callback.trainer = trainer
    trainer.add_callback(callback)
    return callback


def nonfinite_tensors(directory: Path) -> list[str]:
    """Every tensor file of a checkpoint (safetensors, optimizer and scheduler .pt files, at any depth) with the names
    of its tensors holding a NaN or an infinity; empty if all are finite."""
    found = []
    for path in sorted(Path(directory).rglob("*")):
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as f:
                found += [f"{path.name}:{key}" for key in f.keys() if not f.get_tensor(key).isfinite().all()]
        elif path.suffix == ".pt":
            found += [f"{path.name}:{key}" for key in _nonfinite(torch.load(path, weights_only=True), "")]
    return found


def _nonfinite(value, name: str) -> list[str]:
    if torch.is_tensor(value):
        return [name] if value.is_floating_point() and not value.isfinite().all() else []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [name]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _nonfinite(item, f"{name}.{key}")]
    if isinstance(value, (list, tuple)):
        return [found for i, item in enumerate(value) for found in _nonfinite(item, f"{name}.{i}")]
    return []
