"""Work done once, on the main process, with its outcome handed to every process; work every process does, whose
failure on one is raised on all."""

from __future__ import annotations

from collections.abc import Callable

import torch
from accelerate.utils import broadcast_object_list


def on_main_process(accelerator, work: Callable[[], object]):
    """Run ``work`` on the main process and hand every process its result, or raise its error on every process
    (so that none is left waiting at the next collective)."""
    result, error = None, None
    if accelerator.is_main_process:
        try:
            result = work()
        except Exception as err:  # noqa: BLE001 - re-raised below, on every process
            error = err
    if accelerator.num_processes > 1:
        result, error = broadcast_object_list([result, error])
    if error is not None:
        raise error
    return result


class OtherProcessFailed(RuntimeError):
    """Work that every process does failed on another one; that process raises its own error."""


def failed_processes(accelerator, failed: bool) -> list[int]:
    """The ranks of the processes for which ``failed`` is true, the same list on every process: an all-reduce of one
    flag per process, which also waits for all of them as a barrier would."""
    rank = accelerator.process_index
    if accelerator.num_processes == 1:
        return [rank] if failed else []
    flags = torch.zeros(accelerator.num_processes, device=accelerator.device)
    flags[rank] = float(failed)
    return torch.nonzero(accelerator.reduce(flags, "sum")).flatten().tolist()


def on_every_process(
    accelerator, what: str, work: Callable[[], object], other_failed: type[Exception] = OtherProcessFailed
):
    """Run this process's ``work``; if it failed on any process, raise on every one (the failing ones their own error,
    the others ``other_failed`` naming them), so that none is left waiting for them at the next collective."""
    error, result = None, None
    try:
        result = work()
    except Exception as err:  # noqa: BLE001 - raised below, once every process knows
        error = err
    failed = failed_processes(accelerator, error is not None)
    if error is not None:
        raise error
    if failed:
        names = ", ".join(map(str, failed))
        raise other_failed(f"{what} failed on process {names}; that process's error says why.")
    return result
