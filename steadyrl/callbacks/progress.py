"""A tqdm bar for RL runs: step rate plus the latest reward and KL in the postfix."""

from __future__ import annotations

from transformers.trainer_callback import ProgressCallback

POSTFIX_KEYS = {"reward": "reward", "kl": "kl", "loss": "loss"}


class RLProgressCallback(ProgressCallback):
    """Like Trainer's progress bar, but metrics go into the bar's postfix instead of a printed dict per log."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None:
            self.training_bar.set_description("steadyrl")
            self.training_bar.update(state.global_step)
        self.current_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.training_bar is None or not logs:
            return
        postfix = {short: f"{logs[key]:.3f}" for key, short in POSTFIX_KEYS.items() if key in logs}
        if postfix:
            self.training_bar.set_postfix(postfix, refresh=False)
