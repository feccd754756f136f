"""What a resume with another horizon (``max_steps``, ``num_train_epochs``) does to the learning-rate schedule.

The schedule is rebuilt for the run's new total of steps, as if the run had been started with it (what
``transformers.Trainer`` does): extending a linear or cosine run keeps learning past the old end instead of training
at a learning rate of zero. Where that moves the learning rate of the steps still to come, the resume says so before
its first step, with the rate at the resume step under both horizons and the setting that keeps the old schedule.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import get_scheduler
from transformers.utils import logging

logger = logging.get_logger(__name__)

MAX_COMPARED = 10_000  # steps compared between the two schedules (evenly spaced beyond that)


def lr_factor(args, horizon: int):
    """The factor of ``learning_rate`` at each step of ``args``' built-in schedule over ``horizon`` steps (a
    function of the step), or None for a schedule that is not a function of the step alone."""
    parameter = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    warmup = args.get_warmup_steps(horizon)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=horizon,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    lambdas = getattr(scheduler, "lr_lambdas", None)
    return lambdas[0] if lambdas else None


def schedule_change(args, step: int, old_horizon: int, new_horizon: int) -> str | None:
    """The warning for a resume at ``step`` whose total steps moved from ``old_horizon`` to ``new_horizon``, if that
    changes the learning rate of any step the run still takes (a constant schedule stays as it was); else None."""
    if old_horizon == new_horizon or old_horizon <= 0:
        return None
    old, new = lr_factor(args, old_horizon), lr_factor(args, new_horizon)
    if old is None or new is None:
        return None
    stride = max(1, (new_horizon - step) // MAX_COMPARED)
    steps = [s for s in sorted({*range(step, new_horizon, stride), new_horizon - 1}) if s >= step]  # still to take
    first = next((s for s in steps if old(s) != new(s)), None)
    if first is None:
        return None
    lr, name = args.learning_rate, getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    return (
        f"Resuming at step {step} with {old_horizon} -> {new_horizon} total steps changes the learning-rate schedule "
        f"({name}, warmup {args.get_warmup_steps(old_horizon)} -> "
        f"{args.get_warmup_steps(new_horizon)} steps): at step {first} the learning rate is {lr * new(first):.4g}, "
        f"where the schedule of the run that wrote the checkpoint gives {lr * old(first):.4g}. The schedule is rebuilt "
        f"as if the run had started with {new_horizon} steps; to keep the old one, resume with "
        f"max_steps={old_horizon}."
    )


def resume_schedules(args, checkpoint: Path, step: int, horizon: int, schedulers: list, main: bool) -> None:
    """After loading ``schedulers`` from ``checkpoint``: if its horizon differs from ``horizon``, put each one's
    learning rate on the rebuilt schedule now (the loaded optimizer holds the old schedule's rate for the next step),
    and on the main process log ``schedule_change``."""
    saved = json.loads((checkpoint / "trainer_state.json").read_text()).get("max_steps", 0)
    if saved == horizon:
        return
    for scheduler in schedulers:
        if getattr(scheduler, "lr_lambdas", None):
            rates = [
                base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)
            ]
            for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
                group["lr"] = rate
            scheduler._last_lr = rates
    message = schedule_change(args, step, saved, horizon) if main else None
    if message:
        logger.warning(message)
