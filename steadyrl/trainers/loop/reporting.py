"""What the on-policy loop reports: the logged means of each logging step (every process's share averaged), the
completion log, the evaluation the callbacks asked for, and the end-of-training summary."""

from __future__ import annotations

import torch

from ...data.images import image_token_ids
from ...distributed.metrics import reduce_by_name
from ...ops import masked_mean
from ...publish.completions import CompletionsHubPush
from ...rewards import reward_func_name
from ...rollout import Rollout, completion_rows
from ..config.completions_hub import CompletionsHubOptions


class ReportingMixin:
    """Logging and the logging step's evaluation, for ``OnPolicyTrainer``."""

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """``Trainer.log`` (report_to, the printed line, ``log_history``), and the entry appended to
        ``metrics.jsonl``."""
        super().log(logs, start_time)
        if self.metrics_log is not None:
            self.metrics_log.append(self.state.log_history[-1])

    def report_summary(self) -> dict[str, float]:
        """The end-of-training summary, logged as ``Trainer`` logs it: printed, sent to report_to and metrics.jsonl,
        and the last entry of ``log_history`` (``train_loss``, ``train_runtime``, ...). It comes after the run's last
        checkpoint, so no checkpoint holds it and a resumed run's history stays the uninterrupted run's."""
        tokens = torch.tensor(self.meter.tokens, dtype=torch.float64, device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            tokens = self.accelerator.reduce(tokens, "sum")
        pending = self.pending_means()  # as TRL: the steps since the last logging step come with the summary
        summary = self.meter.summary(
            self.state.global_step, self.args.train_batch_size, int(tokens.item()), self.state.log_history, pending
        )
        self.log({**pending, **summary})
        return summary

    def pending_means(self) -> dict[str, float]:
        """Each metric's mean over the steps since the last log (and over the processes); they are cleared."""
        logs = self.pending_metrics.take_means()
        if self.accelerator.num_processes > 1:  # every process saw its own share of the rollout
            logs = reduce_by_name(logs, self.accelerator)
        return logs

    def report_step(self) -> None:
        """Log and evaluate as the callbacks decided at this step's end (before any checkpoint of the step, so that
        its log history holds this step's evaluation)."""
        if self.control.should_log:
            logs = self.pending_means()
            if self.learner.guard.total:  # the running count of steps refused as non-finite, once there is one
                logs["nonfinite_skipped_steps"] = self.learner.guard.total
            self.log(logs)
            if self.args.log_completions:
                self.log_completions()
            self.control.should_log = False
        if self.control.should_evaluate:
            self.evaluate()
            self.control.should_evaluate = False

    def log_completions(self) -> None:
        """Write the latest rollout's completions (every process's: each holds the whole rollout) to the completion
        log, once per rollout."""
        buffer = self.training_buffer.buffer
        if buffer is None or buffer.completions_logged:
            return
        names = [reward_func_name(f) for f in self.reward_funcs]
        images = image_token_ids(self.processor, self.model) if self.processor is not None else ()
        advantages = sample_advantages(buffer.rollout)
        multimodal = self.args.log_multimodal
        rows = completion_rows(buffer.rollout, self.processing_class, names, advantages, images, multimodal)
        if self.completion_log is not None:
            self.completion_log.write(self.state.global_step, rows, self.callback_handler.callbacks)
            if (hub := self.completions_hub()) is not None:  # main process only, a failure is a warning
                hub.push(self.state.global_step, rows)
        buffer.completions_logged = True

    def completions_hub(self) -> CompletionsHubPush | None:
        """GRPO's ``log_completions_hub_repo``: its pusher, made at the first logging step; None if unset."""
        args = self.args
        repo = args.log_completions_hub_repo if isinstance(args, CompletionsHubOptions) else None
        if repo is None:
            return None
        if getattr(self, "_completions_hub", None) is None:
            self._completions_hub = CompletionsHubPush(repo, self.args.hub_token, self.args.hub_private_repo)
        return self._completions_hub


def sample_advantages(rollout: Rollout) -> torch.Tensor | None:
    """One advantage per sample [N] for the completion log: RLOO's as they are, PPO's averaged over the completion's
    tokens; None for an algorithm without advantages."""
    if rollout.advantages is None:
        return None
    if rollout.advantages.dim() == 1:
        return rollout.advantages
    return masked_mean(rollout.advantages, rollout.policy_mask, dim=1)
