"""Reward calls that run long: watched, warned about, and on the main thread interrupted.

A synchronous reward function cannot be stopped from another thread, and runs on the main thread (as in TRL: functions
that time themselves out with SIGALRM, as math_verify does, need that thread). A watcher thread warns about a call that
runs past its threshold (``reward_timeout``, else ``HANG_WARNING_S``), again at each doubling, naming the function, the
step and the line it is at. On the main thread it interrupts the call with a signal sent to that thread
(``INTERRUPT_SIGNAL``, whose handler raises ``RewardInterrupt`` there: a blocking wait or Python code ends at once, C
code once it returns to Python) when ``reward_timeout`` passes, or when a stop signal (SIGTERM / SIGINT) came during
the call and the call then reaches its threshold. A stop signal that comes after the threshold interrupts it at once
(``stop_during_reward_call``, called by the trainer's handler). A call interrupted by a stop ends the run with the
status of a stopped run (``StoppedInRewardFunction``); by ``reward_timeout``, with ``RewardFunctionError``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from transformers.utils import logging

from .reward_checks import RewardFunctionError

logger = logging.get_logger(__name__)

HANG_WARNING_S = 60.0  # without reward_timeout: a call this long is warned about (again at each doubling)
ASYNC_CANCEL_GRACE_S = 5.0  # an async call still running this long after reward_timeout blocks its event loop
INTERRUPT_SIGNAL = signal.SIGRTMIN + 2 if hasattr(signal, "SIGRTMIN") and hasattr(signal, "pthread_kill") else None


class RewardInterrupt(BaseException):
    """Raised in the main thread to end a reward call (not an ``Exception``: the function's handlers let it pass)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "timeout" | "stop"


class StoppedInRewardFunction(SystemExit):
    """A stop signal ended the run while a reward function had not returned: the step was not finished, and the exit
    status is 128 + the signal's number, as for a run the signal stopped after a step."""


@dataclass
class RewardCall:
    what: Callable[[], str]  # "reward function 'f'"
    step: int | None
    timeout: float | None
    sync: bool
    thread: threading.Thread = field(default_factory=threading.current_thread)
    started: float = field(default_factory=time.monotonic)
    interruptible: bool = False  # on the main thread, INTERRUPT_SIGNAL's handler installed
    stop_signal: int | None = None  # a stop signal came during the call
    interrupt: str | None = None  # why the watcher interrupts the main thread
    active: bool = True

    @property
    def threshold(self) -> float:
        """When the call counts as hung: reward_timeout (an async one's, a grace after it), else HANG_WARNING_S."""
        if self.timeout is None:
            return HANG_WARNING_S
        return self.timeout + (0.0 if self.sync else ASYNC_CANCEL_GRACE_S)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def slow_message(self) -> str:
        elapsed, where = self.elapsed(), stack_location(self.thread) if self.sync else ""
        message = f"{self.what()} has been running for {seconds(elapsed)}{at_step(self.step)}{where}. "
        stop = "stop the run with SIGTERM / SIGINT (Ctrl-C): the call is interrupted and the checkpoints are kept"
        if self.interrupt is not None:
            return message + (
                "It was interrupted but has not returned to Python: it is in C code that does not return (a regular "
                "expression, a C extension); only SIGKILL ends the run now. Its checkpoints are intact."
            )
        if not self.sync and self.timeout is not None:
            return message + (
                f"It was not cancelled at reward_timeout={self.timeout:g}: a synchronous call inside it blocks the "
                "event loop. Make that call async, or run it in a thread (asyncio.to_thread)."
            )
        if not self.sync:
            return (
                message
                + "Set reward_timeout to have it cancelled (the run then stops with an error)"
                + (f", or {stop}." if self.interruptible else ".")
            )
        if not self.interruptible:
            return message + (
                "steadyrl cannot interrupt a synchronous function here (off the main thread, as max_staleness runs "
                "them, or without real-time signals), nor hold it to reward_timeout: give the client it waits on a "
                "timeout, or make it async."
            )
        return message + (
            "Set reward_timeout to have it interrupted (the run then stops with an error), give the client it waits "
            f"on a timeout, or {stop}."
        )

    def ended_by(self, reason: str) -> BaseException:
        """The exception that ends the run after the main thread's interrupt."""
        if reason == "stop":
            name, ran = signal.Signals(self.stop_signal).name, seconds(self.elapsed())
            logger.warning(
                f"Received {name} while {self.what()} had run {ran} without returning{at_step(self.step)}: "
                "it was interrupted, and the run stops now without finishing this step. Its checkpoints are intact: "
                "run again with resume_from_checkpoint=True to continue from the newest."
            )
            return StoppedInRewardFunction(128 + self.stop_signal)
        return RewardFunctionError(
            f"{self.what()} did not return within reward_timeout={self.timeout:g} seconds{at_step(self.step)}: it was "
            "interrupted. Raise reward_timeout, make the function faster, or give the client it waits on a timeout."
            + run_stopped(self.step)
        )


_main_call: RewardCall | None = None  # the reward call the main thread is in


def watched(call: Callable, what: Callable[[], str], step: int | None, timeout: float | None, sync: bool = True):
    """``call()``, warned about when it runs past its threshold (``RewardCall.threshold``; again at each doubling).
    On the main thread a synchronous one is interrupted after ``timeout`` (``RewardFunctionError``), and any one by a
    stop signal (``StoppedInRewardFunction``): at once past the threshold, else when it reaches it."""
    global _main_call
    record, done = RewardCall(what, step, timeout, sync), threading.Event()
    try:
        try:
            if record.thread is threading.main_thread():
                record.interruptible, _main_call = can_interrupt_main_thread(), record
            threading.Thread(target=watch, args=(record, done), name="steadyrl-reward-watch", daemon=True).start()
            return call()
        finally:
            record.active = False  # first: no interrupt is raised in this call after this
            done.set()
            if _main_call is record:
                _main_call = None
    except RewardInterrupt as interrupt:
        raise record.ended_by(interrupt.reason) from None


def watch(record: RewardCall, done: threading.Event) -> None:
    """The watcher of one call: each time the call reaches its threshold (then twice it, ...), interrupt the main
    thread where it should end (once), else warn."""
    wait = record.threshold
    while not done.wait(max(0.0, record.started + wait - time.monotonic())):
        reason = "stop" if record.stop_signal is not None else "timeout" if record.sync and record.timeout else None
        if record.interruptible and reason is not None and record.interrupt is None:
            record.interrupt = reason
            signal.pthread_kill(record.thread.ident, INTERRUPT_SIGNAL)
        else:
            logger.warning(record.slow_message())
        wait *= 2


def _interrupt_handler(signum: int, frame) -> None:
    call = _main_call
    if call is not None and call.active and call.interrupt is not None:
        raise RewardInterrupt(call.interrupt)


def can_interrupt_main_thread() -> bool:
    """Whether the watcher can interrupt the main thread: INTERRUPT_SIGNAL exists here and its handler is steadyrl's
    (installed now where the signal has none; then kept, so that an interrupt that lands after its call ended is
    ignored rather than meeting the default action, which ends the process)."""
    if INTERRUPT_SIGNAL is None:
        return False
    current = signal.getsignal(INTERRUPT_SIGNAL)
    if current is not _interrupt_handler:
        if current not in (signal.SIG_DFL, None):  # another library's
            return False
        signal.signal(INTERRUPT_SIGNAL, _interrupt_handler)
    return True


def stop_during_reward_call(signum: int) -> str | None:
    """For the trainer's stop-signal handler, on the main thread: None where that thread is in no reward call.
    Else the stop is recorded, and a call past its threshold is interrupted at once (``RewardInterrupt`` raised here);
    one before it may still return, and what happens then is returned for the handler's message."""
    call = _main_call
    if call is None or not call.active:
        return None
    call.stop_signal = signum
    if call.elapsed() >= call.threshold:
        call.interrupt = "stop"
        raise RewardInterrupt("stop")
    if not call.interruptible:
        return None
    return (
        f"{call.what()} is running: if it returns within {call.threshold:g} s of its start the step finishes as "
        "usual; if not, it is interrupted then and the run stops without finishing this step."
    )


def stack_location(thread: threading.Thread) -> str:
    """Where ``thread`` is: its innermost frame, and the outermost one below this module (the reward function's)."""
    frame = sys._current_frames().get(thread.ident)
    frames = []
    while frame is not None and frame.f_code.co_filename != __file__:
        frames.append(frame)
        frame = frame.f_back
    if not frames:
        return ""
    shown = [frames[0]] if len(frames) == 1 else [frames[0], frames[-1]]
    text = [f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}" for f in shown]
    return f" (it is at {text[0]}" + (f", called from {text[1]})" if len(text) > 1 else ")")


def seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def at_step(step: int | None) -> str:
    return "" if step is None else f" at global step {step}"


def run_stopped(step: int | None) -> str:
    """What a reward failure in training means for the run, and what to do (nothing outside training)."""
    if step is None:
        return ""
    return (
        " The run stopped; its checkpoints are intact: once the function (or the service it calls) works, run the "
        "same command with resume_from_checkpoint=True. A service's transient errors are best retried inside the "
        "function (docs/faults.md)."
    )
