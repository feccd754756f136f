"""Stopping cleanly when the scheduler says so: SIGTERM or SIGINT ends the run after the current step and a
checkpoint; a second signal ends it at once."""

from __future__ import annotations

import os
import signal
import threading

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """While entered, SIGTERM and SIGINT set ``received`` instead of killing the process; a second one is
    delivered with its default action (the process dies with that signal's status)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.received: int | None = None
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
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        logger.warning(
            f"Received {signal.Signals(signum).name}: finishing this step, then writing a checkpoint and exiting. "
            "Send it again to exit at once without a checkpoint."
        )

    def stop_requested(self, accelerator) -> bool:
        """Whether any process received a signal; every process gets the same answer, so all stop at one step."""
        requested = self.received is not None
        if accelerator.num_processes > 1:
            flag = torch.tensor([float(requested)], device=accelerator.device)
            requested = accelerator.reduce(flag, "sum").item() > 0
        return requested
