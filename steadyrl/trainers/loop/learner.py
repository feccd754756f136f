"""The learner: one global step's update. The loss and its backward pass over micro-batches, clipping, the optimizer
and scheduler steps of every trained module, and the reference's mixing under ``sync_ref_model``."""

from __future__ import annotations

import contextlib
from collections import defaultdict

from ...models.loading import deepspeed_backward
from ...rollout import Rollout
from .reference_sync import mix_into_reference, sync_due
from .sources import TrainerStage


class Learner(TrainerStage):
    """Trains the modules ``trained_modules()`` returns (the actor first) on one mini-batch per call, with the
    algorithm's ``compute_loss_on_batch(model, micro_batch) -> (loss or {module: loss}, metrics)``."""

    def step(self, minibatch: Rollout) -> dict[str, float]:
        """One global step: the loss and its backward pass over micro-batches of ``micro_train_batch_size``
        (gradients accumulate and are all-reduced on the last one), then ``apply_gradients``; its metrics."""
        trainer = self.trainer
        accelerator, size = trainer.accelerator, trainer.args.micro_train_batch_size
        modules = {module.name: module for module in trainer.trained_modules()}
        for module in modules.values():
            module.engine.train()
        num_micro = len(minibatch) // size
        metrics: dict[str, float] = defaultdict(float)
        pad_id = getattr(trainer.processing_class, "pad_token_id", None) or 0  # masked: any id keeps the numbers
        padding = {"multiple_of": trainer.args.pad_to_multiple_of, "pad_token_id": pad_id}
        for i in range(num_micro):
            batch = minibatch.select(slice(i * size, (i + 1) * size)).trimmed(**padding).to(accelerator.device)
            last = i == num_micro - 1
            with contextlib.ExitStack() as stack:
                if not last:  # gradients are all-reduced on the last micro-batch only
                    for module in modules.values():
                        stack.enter_context(accelerator.no_sync(module.engine))
                loss, batch_metrics = trainer.compute_loss_on_batch(trainer.model_wrapped, batch)
                losses = loss if isinstance(loss, dict) else {"actor": loss}
                total = sum(losses.values())
                if trainer.is_deepspeed_enabled:
                    for name, part in losses.items():
                        deepspeed_backward(modules[name].engine, part, last)
                else:
                    accelerator.backward(total / num_micro)
            metrics["loss"] += total.item() / num_micro
            for key, value in batch_metrics.items():
                if key.endswith("/min"):  # the extremes over the micro-batches; the rest: their mean
                    metrics[key] = min(metrics.get(key, float(value)), float(value))
                elif key.endswith("/max"):
                    metrics[key] = max(metrics.get(key, float(value)), float(value))
                else:
                    metrics[key] += float(value) / num_micro
        return {**metrics, **self.apply_gradients()}

    def apply_gradients(self) -> dict[str, float]:
        """Clip the accumulated gradients, step every optimizer and scheduler, zero the gradients; their metrics."""
        trainer, metrics = self.trainer, {}
        max_norm = trainer.args.max_grad_norm
        for module in trainer.trained_modules():
            prefix = "" if module.name == "actor" else f"{module.name}_"
            if trainer.is_deepspeed_enabled:  # the engine clipped (gradient_clipping) and stepped at the boundary
                norm = module.engine.get_global_grad_norm()
                metrics[f"{prefix}grad_norm"] = float(norm) if norm is not None else 0.0
            elif max_norm and max_norm > 0:
                norm = trainer.accelerator.clip_grad_norm_(module.engine.parameters(), max_norm)
                metrics[f"{prefix}grad_norm"] = float(norm)
            metrics[f"{prefix}learning_rate"] = module.scheduler.get_last_lr()[0]
            module.optimizer.step()
            module.scheduler.step()
            module.optimizer.zero_grad(set_to_none=True)
        return metrics

    def sync_reference(self, global_step: int) -> None:
        """With ``sync_ref_model``, after every ``ref_model_sync_steps``-th global step: reference = alpha x policy +
        (1 - alpha) x reference (reference_sync.py)."""
        trainer = self.trainer
        if sync_due(trainer.args, global_step):
            mix_into_reference(
                trainer.model,
                trainer.reference_module,
                trainer.args.ref_model_mixup_alpha,
                trainer.accelerator.is_main_process,
            )
