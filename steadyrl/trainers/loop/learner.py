"""The learner: one global step's update. The loss and its backward pass over micro-batches, the gradient norm and
clipping, the verdict on non-finite losses and gradients (update_guard.py), the optimizer and scheduler steps of every
trained module, and ``Trainer``'s callback events around them."""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable

import torch
from transformers.utils import logging

from ...checkpoint.checkpointer import TrainedModule
from ...models.loading import deepspeed_backward
from ...rollout import Rollout
from .algorithm import Algorithm
from .update_guard import UpdateGuard, verdicts

logger = logging.get_logger(__name__)


class Learner:
    """Trains the given modules (the actor first) on one mini-batch per call, with the algorithm's
    ``loss(model, micro_batch) -> (loss or {module: loss}, metrics)`` between its ``begin_step`` and ``end_step``.

    Events, in ``Trainer``'s order: ``on_substep_end`` after each micro-batch but the last, then (gradients clipped)
    ``on_pre_optimizer_step``, the optimizer steps, ``on_optimizer_step``. A module whose loss or gradient norm is not
    finite is not stepped (``UpdateGuard``, its ``guard``: a checkpoint part).

    Args:
        args: the config (micro_train_batch_size, max_grad_norm, pad_to_multiple_of, logging_nan_inf_filter,
            max_consecutive_nonfinite_steps).
        accelerator: the run's ``Accelerator``.
        algorithm: the ``Algorithm`` whose loss is trained.
        pad_token_id: the policy tokenizer's padding id (None: 0; padding is masked, any id gives the same numbers).
        deepspeed: whether the modules are DeepSpeed engines (they clip, step and check overflow themselves).

    Example::

        learner = Learner(args, accelerator, algorithm, tokenizer.pad_token_id, deepspeed=False)
        metrics = learner.step(minibatch, trainer.trained_modules(), global_step=0, fire=lambda event: None)
    """

    def __init__(self, args, accelerator, algorithm: Algorithm, pad_token_id: int | None, deepspeed: bool) -> None:
        self.args, self.accelerator, self.algorithm, self.deepspeed = args, accelerator, algorithm, deepspeed
        self.padding = {"multiple_of": args.pad_to_multiple_of, "pad_token_id": pad_token_id or 0}
        self.guard = UpdateGuard(args.max_consecutive_nonfinite_steps, accelerator.is_main_process)  # a checkpoint part
        self.last_refused: dict[str, str] = {}  # the modules whose update the last step refused, with the reason

    def step(
        self, minibatch: Rollout, modules: list[TrainedModule], global_step: int, fire: Callable[[str], None]
    ) -> dict[str, float]:
        """The step that makes ``global_step`` + 1: the loss and its backward pass over micro-batches of
        ``micro_train_batch_size`` (gradients accumulate and are all-reduced on the last one), then
        ``apply_gradients``; its metrics. ``fire(event)`` calls the callbacks' ``Trainer`` events."""
        accelerator, size, algorithm = self.accelerator, self.args.micro_train_batch_size, self.algorithm
        engines = {module.name: module.engine for module in modules}
        for engine in engines.values():
            engine.train()
        num_micro = len(minibatch) // size
        algorithm.begin_step(global_step)
        metrics: dict[str, float] = defaultdict(float)
        losses: dict[str, float] = defaultdict(float)  # each module's loss summed over the micro-batches
        for i in range(num_micro):
            batch = minibatch.select(slice(i * size, (i + 1) * size)).trimmed(**self.padding).to(accelerator.device)
            last = i == num_micro - 1
            with contextlib.ExitStack() as stack:
                if not last:  # gradients are all-reduced on the last micro-batch only
                    for engine in engines.values():
                        stack.enter_context(accelerator.no_sync(engine))
                loss, batch_metrics = algorithm.loss(engines["actor"], batch)
                parts = loss if isinstance(loss, dict) else {"actor": loss}
                total = sum(parts.values())
                if self.deepspeed:
                    for name, part in parts.items():
                        deepspeed_backward(engines[name], part, last)
                else:
                    accelerator.backward(total / num_micro)
            for name, part in parts.items():
                losses[name] += part.item()
            metrics["loss"] += total.item() / num_micro
            for key, value in batch_metrics.items():
                if key.endswith("/min"):  # the extremes over the micro-batches; the rest: their mean
                    metrics[key] = min(metrics.get(key, float(value)), float(value))
                elif key.endswith("/max"):
                    metrics[key] = max(metrics.get(key, float(value)), float(value))
                else:
                    metrics[key] += float(value) / num_micro
            if not last:
                fire("on_substep_end")
        if self.args.logging_nan_inf_filter and not math.isfinite(metrics["loss"]):
            del metrics["loss"]  # as Trainer: the logged loss is the mean of the steps whose loss was finite
        metrics.update(self.apply_gradients(losses, minibatch, modules, global_step, fire))
        return {**metrics, **algorithm.end_step(self.last_refused)}

    def apply_gradients(
        self, losses: dict[str, float], minibatch: Rollout, modules: list[TrainedModule], global_step: int, fire
    ) -> dict[str, float]:
        """Clip the accumulated gradients and step every optimizer and scheduler whose module's loss and gradient norm
        are finite on every process; zero the gradients. Its metrics: each module's grad_norm and learning_rate."""
        deepspeed, scaler = self.deepspeed, self.accelerator.scaler
        norms = {m.name: None if deepspeed else self.clip(m) for m in modules}  # DeepSpeed clips in its step
        refused = verdicts(*self.over_processes(losses, norms))
        fire("on_pre_optimizer_step")
        for module in modules:
            if deepspeed:
                norms[module.name] = self.deepspeed_step(module, refused)
            elif module.name not in refused:
                module.optimizer.step()
            elif scaler is not None:  # fp16: lower the loss scale as for a step that overflowed
                scaler.update()
        fire("on_optimizer_step")
        metrics = {}
        for module in modules:
            prefix = "" if module.name == "actor" else f"{module.name}_"
            if deepspeed or self.args.max_grad_norm:
                metrics[f"{prefix}grad_norm"] = norms[module.name]
            metrics[f"{prefix}learning_rate"] = module.scheduler.get_last_lr()[0]
            if module.name not in refused:
                module.scheduler.step()
            module.optimizer.zero_grad(set_to_none=True)
        self.last_refused = refused
        prompts = self.prompts_of(minibatch) if refused else []
        loss_scaled = scaler is not None or any(
            deepspeed and m.engine.fp16_enabled() and m.engine.dynamic_loss_scale() for m in modules
        )
        self.guard.record(global_step + 1, refused, prompts, loss_scaled)
        return metrics

    @staticmethod
    def deepspeed_step(module, refused: dict[str, str]) -> float:
        """Step ``module``'s DeepSpeed engine, which clips and skips an update whose gradient norm is not finite
        itself (its overflow check, all-reduced); ``refused`` then holds what the engine refused, and only that.
        Its gradient norm (inf for a skipped step, as DeepSpeed reports one)."""
        module.engine.step()
        reason = refused.pop(module.name, None)
        if not module.engine.was_step_applied():
            refused[module.name] = reason or "grad_norm not finite"
            return math.inf
        if reason is not None:  # a non-finite loss whose gradients were finite: the weights stay finite
            logger.warning(f"The {module.name}'s {reason}, but its gradients were finite and DeepSpeed applied them.")
        norm = module.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def clip(self, module) -> float:
        """``module``'s global gradient norm (over every process and shard), its gradients clipped to
        ``max_grad_norm`` if set."""
        max_norm = self.args.max_grad_norm
        if max_norm:
            norm = self.accelerator.clip_grad_norm_(module.engine.parameters(), max_norm)
        else:  # the norm alone (all-reduced gradients: the same on every process; FSDP2 shards: a DTensor)
            norm = torch.nn.utils.get_total_norm([p.grad for p in module.engine.parameters() if p.grad is not None])
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def over_processes(
        self, losses: dict[str, float], norms: dict[str, float | None]
    ) -> tuple[dict[str, float], dict[str, float | None]]:
        """Each module's loss and gradient norm summed over the processes (one all-reduce, in float64): finite where
        every process's is, so that every process refuses the same updates."""
        accelerator, names = self.accelerator, list(norms)
        if accelerator.num_processes == 1:
            return losses, norms
        values = [losses.get(name, 0.0) for name in names] + [norms[name] or 0.0 for name in names]
        summed = accelerator.reduce(torch.tensor(values, dtype=torch.float64, device=accelerator.device), "sum")
        summed = summed.tolist()
        total_norms = {name: None if norms[name] is None else v for name, v in zip(names, summed[len(names) :])}
        return dict(zip(names, summed[: len(names)])), total_norms

    def prompts_of(self, minibatch: Rollout) -> list[int]:
        """The dataset rows of the mini-batch's prompts on every process, sorted, each once (every process calls it)."""
        accelerator, own = self.accelerator, minibatch.prompt_index
        rows = own.tolist() if own is not None else []
        if accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            rows = gather_object(rows)
        return sorted(set(rows))
