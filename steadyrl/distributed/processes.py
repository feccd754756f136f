"""Work done once, on the main process, with its outcome handed to every process."""

from __future__ import annotations

from collections.abc import Callable

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
