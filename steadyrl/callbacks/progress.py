"""A tqdm bar for RL runs: step rate plus the latest reward and KL in the postfix, each log printed above it."""

from __future__ import annotations

from tqdm.auto import tqdm
from transformers.trainer_callback import ProgressCallback

POSTFIX_KEYS = {"reward": "reward", "kl": "kl", "loss": "loss"}
QUIET_LEVELS = ("warning", "error", "critical")


class RLProgressCallback(ProgressCallback):
    """Trainer's progress bar, with the step rate and the latest reward, KL and loss in its postfix."""

    def on_train_begin(self, args, state, control, **kwargs):
        """The bar starts at ``global_step`` (a resumed run's), which its rate and time left leave out."""
        if state.is_world_process_zero:
            self.training_bar = tqdm(
                total=state.max_steps, initial=state.global_step, desc="steadyrl", dynamic_ncols=True
            )
        self.current_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The logged metrics as Trainer prints them (a dict line above the bar, unless ``log_level`` is warning or
        quieter), and reward / KL / loss in the bar's postfix at once."""
        if self.training_bar is None or not logs:
            return
        if args.log_level not in QUIET_LEVELS:
            super().on_log(args, state, control, logs=logs, **kwargs)
        postfix = {short: f"{logs[key]:.3f}" for key, short in POSTFIX_KEYS.items() if key in logs}
        if postfix:
            self.training_bar.set_postfix(postfix)
