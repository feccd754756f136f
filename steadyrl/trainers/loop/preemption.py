"""Stopping cleanly when the scheduler says so: SIGTERM or SIGINT ends the run after the current step and a
checkpoint, with the exit status of a process the signal ended (128 + its number: 143 for SIGTERM, 130 for SIGINT),
so that a Kubernetes Job, SLURM requeue or similar sees an unfinished run and restarts it; a second signal ends it at
once. A signal during the last step lets the run complete (status 0).

Under a launcher (torchrun, ``accelerate launch``) the workers are torch's elastic agent's children, each in a
session of its own. The agent turns a SIGTERM / SIGINT / SIGHUP / SIGQUIT it receives into a ``SignalException``,
sends that signal to every worker's process group, waits ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds (30 by default;
torchrun ``--shutdown_timeout``) for them to exit, SIGKILLs the ones left and exits with the exception. A scheduler
such as SLURM signals every process of the job itself as well, so a worker then gets the signal twice within
milliseconds: there, a repeat within ``REPEAT_WINDOW_S`` counts as the same signal.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
from transformers.utils import logging

from ...reward_watch import stop_during_reward_call

logger = logging.get_logger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
LAUNCHER_ENV = "TORCHELASTIC_RUN_ID"  # set in its workers by torch's elastic agent (torchrun, accelerate launch)
REPEAT_WINDOW_S = 2.0  # under a launcher: a repeat this soon is the launcher's copy of the scheduler's signal


def stopped_status(signum: int | None) -> int:
    """The exit status of a run a signal stopped before its end: 128 + the signal's number, as a shell reports a
    process the signal killed; a process that learned of another's signal exits as for SIGTERM."""
    return 128 + (signum or signal.SIGTERM)


def launcher_shutdown_timeout() -> str:
    """Seconds the elastic agent waits for its workers after forwarding a signal before it SIGKILLs them, as far as
    its environment (inherited by the workers) tells."""
    return os.environ.get("PET_SHUTDOWN_TIMEOUT") or os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") or "30"


class StopSignals:
    """While entered, SIGTERM and SIGINT set ``received`` instead of killing the process; a second one is
    delivered with its default action (the process dies with that signal's status). Under a launcher, a second one
    within ``REPEAT_WINDOW_S`` of the first is ignored."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.received: int | None = None
        self.under_launcher = LAUNCHER_ENV in os.environ
        self._received_at = 0.0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if self.enabled:
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:
            if self.under_launcher and time.monotonic() - self._received_at < REPEAT_WINDOW_S:
                return  # the launcher's copy of a signal the scheduler also sent here
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received, self._received_at = signum, time.monotonic()
        in_reward_call = stop_during_reward_call(signum)  # raises where a reward call that looks hung is to end now
        message = (
            f"Received {signal.Signals(signum).name}: finishing this step, then writing a checkpoint and exiting. "
            "Send it again to exit at once without a checkpoint."
        )
        if in_reward_call:
            message += " " + in_reward_call
        if self.under_launcher:
            message += (
                f" The launcher SIGKILLs its workers {launcher_shutdown_timeout()} s after it forwards a signal "
                "(TORCH_ELASTIC_SHUTDOWN_TIMEOUT, torchrun --shutdown_timeout): set it above the time of a step and "
                f"a checkpoint. A repeat within {REPEAT_WINDOW_S:g} s counts as this signal."
            )
        logger.warning(message)

    def stop_requested(self, accelerator) -> bool:
        """Whether any process received a signal; every process gets the same answer, so all stop at one step."""
        requested = self.received is not None
        if accelerator.num_processes > 1:
            flag = torch.tensor([float(requested)], device=accelerator.device)
            requested = accelerator.reduce(flag, "sum").item() > 0
        return requested
