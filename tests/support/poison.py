"""Non-finite numbers put into a run on purpose: a NaN (or inf) gradient element during chosen steps, as an overflow,
a log of zero or a 0/0 would make one, and the tensors of a checkpoint checked for any."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import TrainerCallback


class PoisonGradient(TrainerCallback):
    """During the steps that make the global steps ``steps``, on process ``rank``, the gradient reaching the output of
    the model's final norm gets one ``value`` element (with ``forward``: the output itself is made ``value``, and so
    the loss), so every parameter before it gets a NaN (or inf) gradient, which the all-reduce or reduce-scatter
    spreads to every process. A hook on the activation, not on a parameter: FSDP2 and ZeRO-3 compute with other
    tensors than the parameters they hold. ``module``: "actor" (the policy) or "critic" (PPO)."""

    def __init__(
        self, steps, rank: int = 0, value: float = math.nan, module: str = "actor", forward: bool = False
    ) -> None:
        self.steps, self.rank, self.value, self.module = set(steps), rank, value, module
        self.forward = forward  # the activation itself, so the loss too (else its gradient only)
        self.trainer, self.handle, self.poisoned = None, None, []

    def final_norm(self) -> torch.nn.Module:
        model = self.trainer.model if self.module == "actor" else self.trainer.critic.model
        return [module for name, module in model.named_modules() if name.endswith("norm")][-1]

    def poison(self, module, inputs, output):
        if self.forward and torch.is_tensor(output):
            return output + self.value  # every position: one at a masked position would not reach the loss
        if torch.is_tensor(output) and output.requires_grad:

            def poisoned(grad):
                grad = grad.clone()
                grad.view(-1)[0] = self.value
                return grad

            output.register_hook(poisoned)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 in self.steps and self.trainer.accelerator.process_index == self.rank:
            self.handle = self.final_norm().register_forward_hook(self.poison)
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
