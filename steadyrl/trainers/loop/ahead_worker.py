"""The thread that generates and scores rollouts ahead of training (``max_staleness``): one daemon thread running
jobs in the order they were submitted, each answered through a ``Future``.

Not a ``ThreadPoolExecutor``: the interpreter joins an executor's threads as it exits, so a job stuck in a reward
function or on a vLLM server that is gone would keep the process alive (and a preempted run from ever exiting). A
daemon thread is left behind instead, after a bounded wait that says where it is stuck."""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future


class AheadWorker:
    """Runs submitted jobs one at a time, in order, on a daemon thread."""

    def __init__(self, name: str = "steadyrl-ahead") -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.doing: str | None = None  # what the running job does, for a report if it does not end
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, what: str, work: Callable, *args) -> Future:
        """Run ``work(*args)`` after the jobs submitted before; ``what`` says what it does (in a report)."""
        future: Future = Future()
        self.jobs.put((future, what, work, args))
        return future

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            future, what, work, args = job
            if not future.set_running_or_notify_cancel():  # cancelled before it started
                continue
            self.doing = what
            try:
                result = work(*args)
            except BaseException as err:  # noqa: BLE001 - handed to whoever waits for the job
                future.set_exception(err)
            else:
                future.set_result(result)
            finally:
                self.doing = None

    def stop(self, timeout: float) -> str | None:
        """Cancel the jobs not started and let the running one end, waiting at most ``timeout`` seconds; None if it
        ended, else what it is doing and where (its thread's stack), and the thread is left behind."""
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        self.jobs.put(None)
        self.thread.join(timeout)
        if not self.thread.is_alive():
            return None
        frame = sys._current_frames().get(self.thread.ident)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(its stack is not available)\n"
        return f"{self.doing or 'a job'}; it is at:\n{where}"
