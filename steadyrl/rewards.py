"""Reward functions with TRL's calling convention: what they receive (``RewardInputs``), how they are called (plain
functions one after the other, ``async def`` ones concurrently on one event loop, each within ``reward_timeout``,
``None`` for a sample a function does not apply to), and how their scores combine. Every result is checked and a
failure names its function, the step and what to do; a call that runs long is warned about and, on the main thread,
interrupted by ``reward_timeout`` or a stop signal (``watched``). The checks made when the trainer is built are in
reward_checks.py."""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .reward_checks import (  # noqa: F401 (the trainers import these from here)
    ALWAYS_PASSED,
    RewardFunc,
    RewardFunctionError,
    as_list,
    check_reward_funcs,
    check_reward_timeout,
    reward_func_name,
)
from .reward_watch import at_step, run_stopped, watched


@dataclass
class RewardInputs:
    """What reward functions, reward models and judges read of one rollout's N completions."""

    prompts: list  # as in the dataset: strings, or lists of {"role", "content"} messages
    completions: list  # strings, or [{"role": "assistant", "content": text}] for conversations (TRL's convention)
    completion_ids: list[list[int]]  # the sampled token ids, EOS included where one was sampled
    columns: dict[str, list]  # the dataset's other columns, one value per completion
    prompt_ids: list[list[int]]  # the prompt token ids the policy saw (chat template applied, truncated)
    prompt_texts: list[str]  # the prompts as text, chat template applied
    completion_texts: list[str]
    extra: dict[str, list] = field(default_factory=dict)  # more keyword arguments for the functions, as the columns
    logged_metrics: dict[str, list[float]] = field(default_factory=dict)  # what the functions gave ``log_metric``

    def metric_means(self) -> dict[str, float]:
        """Each metric the reward functions logged, averaged over its values (summed in sorted order, so that the
        order in which concurrent async functions logged does not change the result)."""
        return {name: sum(sorted(values)) / len(values) for name, values in self.logged_metrics.items() if values}


def is_async_reward(func: RewardFunc) -> bool:
    """Whether calling ``func`` returns a coroutine: an ``async def`` function, a partial of one, or an object whose
    ``__call__`` is ``async def`` (TRL's ``is_async_callable``)."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def weighted_total(scores: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[N] the weighted sum over reward functions of scores [N, R], leaving out the functions that returned
    ``None`` (NaN) for a sample, as TRL's ``nansum``."""
    return (scores * weights.to(scores.device)).nansum(1)


def score_completions(
    funcs: list[RewardFunc], inputs: RewardInputs, trainer_state=None, timeout: float | None = None
) -> torch.Tensor:
    """Call every reward function; return scores [num_completions, num_funcs], NaN where a function returned
    ``None``. A reward model (an object with ``score_inputs``) reads the token ids or texts itself; any other callable
    gets TRL's keyword arguments (``reward_kwargs``). Async functions run concurrently, after the others; the results
    keep the functions' order whichever finishes first. Each function has ``timeout`` seconds (``watched``)."""
    kwargs = reward_kwargs(inputs, trainer_state)
    step = getattr(trainer_state, "global_step", None)
    columns: list[list[float] | None] = [None] * len(funcs)
    waiting = []
    for j, func in enumerate(funcs):
        if hasattr(func, "score_inputs"):
            call = functools.partial(func.score_inputs, inputs)
        elif is_async_reward(func):
            waiting.append(j)
            continue
        else:
            call = functools.partial(func, **kwargs)
        columns[j] = checked_values(func, named_call(func, call, step, timeout), inputs)
    if waiting:
        results = run_async([funcs[j] for j in waiting], kwargs, timeout, step)
        for j, values in zip(waiting, results):
            columns[j] = checked_values(funcs[j], values, inputs)
    scores = torch.tensor(columns, dtype=torch.float32).reshape(len(funcs), len(inputs.completions)).T.contiguous()
    refuse_unscored(scores, funcs, inputs)
    return scores


def reward_kwargs(inputs: RewardInputs, trainer_state) -> dict:
    """TRL's keyword arguments: the completions, the dataset's columns and ``extra``, the trainer's state, and
    ``log_metric`` (into ``inputs.logged_metrics``) and ``log_extra`` (accepted; steadyrl's completion log does not
    show extra columns)."""

    def log_metric(name: str, value: float) -> None:
        inputs.logged_metrics.setdefault(name, []).append(float(value))

    def log_extra(column: str, values: list) -> None:
        """Accepted for TRL's reward functions; the values are not logged."""

    return {
        "prompts": inputs.prompts,
        "completions": inputs.completions,
        "completion_ids": inputs.completion_ids,
        **inputs.columns,
        **inputs.extra,
        "trainer_state": trainer_state,
        "log_extra": log_extra,
        "log_metric": log_metric,
    }


def named_call(func: RewardFunc, call: Callable, step: int | None = None, timeout: float | None = None):
    """``call()`` of a synchronous reward function or a reward model, ``watched``; a failure names the function."""
    what = f"reward function {reward_func_name(func)!r}"
    try:
        return watched(call, lambda: what, step, timeout)
    except RewardFunctionError:
        raise
    except Exception as err:
        raise raised(func, err, step) from err


def raised(func: RewardFunc, err: Exception, step: int | None = None) -> RewardFunctionError:
    service = service_url(err)
    calling = f" (calling {service})" if service else ""
    message = f"reward function {reward_func_name(func)!r} raised {type(err).__name__}: {err}{calling}{at_step(step)}"
    return RewardFunctionError(message + ("." + run_stopped(step) if step is not None else ""))


def service_url(err: BaseException | None) -> str | None:
    """The URL a failed request went to, where the error or one it came from holds it (urllib's ``HTTPError.url``,
    ``requests``' and ``httpx``' ``request.url``, aiohttp's ``request_info.url``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        for holder in (err, getattr(err, "request", None), getattr(err, "request_info", None)):
            url = getattr(holder, "url", None)
            if isinstance(url, str) or (url is not None and type(url).__name__ in ("URL", "Url")):
                return str(url)
        err = err.__cause__ or err.__context__
    return None


def checked_values(func: RewardFunc, values, inputs: RewardInputs) -> list[float]:
    """``values`` as floats, NaN for ``None``; refused unless one per completion, each ``None`` or finite (a NaN
    the function returned is a bug, not "does not apply")."""
    name, n = reward_func_name(func), len(inputs.completions)
    try:
        values = list(values)
        numbers = [None if v is None else float(v) for v in values]
    except (TypeError, ValueError) as err:
        raise RewardFunctionError(
            f"reward function {name!r} must return a list of {n} floats (or None where it does not apply), got "
            f"{type(values).__name__}: {err}"
        ) from err
    if len(numbers) != n:
        raise RewardFunctionError(f"reward function {name!r} returned {len(numbers)} values for {n} completions.")
    bad = [i for i, v in enumerate(numbers) if v is not None and not math.isfinite(v)]
    if bad:
        raise RewardFunctionError(
            f"reward function {name!r} returned a non-finite value ({numbers[bad[0]]}) for completion {bad[0]} "
            f"({inputs.completion_texts[bad[0]]!r}); {len(bad)} of {n} values are not finite. Return None for a "
            "completion the function does not apply to."
        )
    return [math.nan if v is None else v for v in numbers]


def refuse_unscored(scores: torch.Tensor, funcs: Sequence[RewardFunc], inputs: RewardInputs) -> None:
    """Refuse a sample for which every reward function returned ``None``: it has no reward at all. (TRL warns and
    trains it with advantage 0; steadyrl refuses, as a dataset row no function applies to is a bug to fix.)"""
    unscored = torch.isnan(scores).all(1).nonzero().flatten().tolist()
    if unscored:
        i = unscored[0]
        names = [reward_func_name(f) for f in funcs]
        raise RewardFunctionError(
            f"every reward function {names} returned None for sample {i} (prompt {inputs.prompts[i]!r}, completion "
            f"{inputs.completion_texts[i]!r}); {len(unscored)} of {len(scores)} samples have no reward. Make at "
            "least one function apply to every sample (return a number where it applies)."
        )


# ---- async reward functions ----------------------------------------------------------------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for async reward functions, running on a daemon thread (started on first use): one
    loop for the whole run, so that clients an async function keeps (an HTTP session) stay on their loop, and usable
    where the caller's thread already runs a loop (a notebook)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop, ready = asyncio.new_event_loop(), threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=run, name="steadyrl-reward-loop", daemon=True)
            thread.start()
            ready.wait()
            atexit.register(loop.call_soon_threadsafe, loop.stop)
            _loop = loop
    return _loop


def run_async(funcs: list[RewardFunc], kwargs: dict, timeout: float | None, step: int | None = None) -> list:
    """Await every function concurrently, each within ``timeout`` seconds; their results in the functions' order.
    The first failure in that order is raised, naming its function. The wait is ``watched``."""
    pending = [reward_func_name(func) for func in funcs]  # the functions that have not returned yet

    async def call(func):
        try:
            task = asyncio.ensure_future(func(**kwargs))
        except Exception as err:
            raise raised(func, err, step) from err
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        finally:
            if not task.done():  # timed out, or the wait was cancelled (a stop signal)
                task.cancel()
            pending.remove(reward_func_name(func))
        if not done:
            raise RewardFunctionError(
                f"async reward function {reward_func_name(func)!r} did not return within reward_timeout={timeout} "
                f"seconds{at_step(step)}: raise reward_timeout, or make the function faster.{run_stopped(step)}"
            )
        try:
            return task.result()
        except Exception as err:
            raise raised(func, err, step) from err

    async def gather():
        return await asyncio.gather(*(call(func) for func in funcs), return_exceptions=True)

    def waiting_for() -> str:
        names = pending or [reward_func_name(func) for func in funcs]
        return f"async reward function {names[0]!r}" if len(names) == 1 else f"async reward functions {names}"

    future = asyncio.run_coroutine_threadsafe(gather(), event_loop())
    try:
        results = watched(future.result, waiting_for, step, timeout, sync=False)
    except BaseException:
        future.cancel()
        raise
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
